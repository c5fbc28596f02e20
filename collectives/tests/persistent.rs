//! Persistent all-reduce (`persistent.rs`): one request, planned once,
//! started for many rounds whose inputs change, over real TCP sockets and
//! real shared memory, at 1, 2, 3, 4 and 8 ranks; every element of every
//! round checked exactly. Also: every algorithm, persistent rounds mixed
//! with ordinary collectives and with a second request, and misuse (start
//! while running, buffers while running, drop while running).

use gw_collectives::local::local_world;
use gw_collectives::{Algo, Communicator, Element, Error, OneSided, RedOp, TransportChoice};
use half::{bf16, f16};
use std::fmt::Debug;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const ROUNDS: usize = 50;
/// Rounds of the 4 MiB message: enough to run both the `wait` and the
/// `test` path several times on the same request.
const BIG_ROUNDS: usize = 6;
/// Rounds of each small request for 8 ranks over libfabric's shm provider,
/// which offers no wait object: 16 spinning threads on CI's 2 cores take
/// 50-160 ms a round there (its 50-round matrix alone was 60 s of the
/// suite). Still two cycles of every round-dependent input, and both the
/// `wait` and the `test` path five times.
const SPINNING_ROUNDS: usize = 10;

/// Runs `body` on every rank's communicator, each on a thread of its own,
/// and panics naming `what` and the first rank's error.
fn on_each_rank<F>(comms: Vec<Communicator>, what: &str, body: F)
where
    F: Fn(Communicator) -> Result<(), String> + Clone + Send + 'static,
{
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let body = body.clone();
            std::thread::spawn(move || body(c))
        })
        .collect();
    for t in threads {
        if let Err(e) = t.join().expect("rank thread") {
            panic!("{what}: {e}");
        }
    }
}

/// Element types the tests check exactly: small integers are exact in all.
trait Val: Element + PartialEq + Debug {
    fn of(v: i64) -> Self;
}
impl Val for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
}
impl Val for f64 {
    fn of(v: i64) -> Self {
        v as f64
    }
}
impl Val for i32 {
    fn of(v: i64) -> Self {
        v as i32
    }
}
impl Val for i64 {
    fn of(v: i64) -> Self {
        v
    }
}
impl Val for f16 {
    fn of(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
}
impl Val for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
}

/// Rank `r`'s element `i` in round `k`: 0..=4, or 1..=2 for products (so
/// 8 ranks' product, 256, is exact even in bf16).
fn input(op: RedOp, r: u32, k: usize, i: usize) -> i64 {
    if op == RedOp::Prod {
        1 + ((r as usize + i + k) % 2) as i64
    } else {
        ((r as usize * 7 + i * 3 + k * 5) % 5) as i64
    }
}

fn expected(op: RedOp, n: u32, k: usize, i: usize) -> i64 {
    let vals = (0..n).map(|r| input(op, r, k, i));
    match op {
        RedOp::Sum => vals.sum(),
        RedOp::Prod => vals.product(),
        RedOp::Min => vals.min().unwrap_or(0),
        RedOp::Max => vals.max().unwrap_or(0),
        _ => unreachable!("not tested: {op:?}"),
    }
}

fn fill<T: Val>(buf: &mut [T], op: RedOp, r: u32, k: usize) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = T::of(input(op, r, k, i));
    }
}

fn check<T: Val>(got: &[T], op: RedOp, n: u32, k: usize, what: &str) -> Result<(), String> {
    for (i, x) in got.iter().enumerate() {
        let want = T::of(expected(op, n, k, i));
        if *x != want {
            return Err(format!(
                "{what}: round {k} element {i} of {}: got {x:?}, want {want:?}",
                got.len()
            ));
        }
    }
    Ok(())
}

fn world(
    n: u32,
    transport: TransportChoice,
    algo: Option<Algo>,
    key: &str,
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    world_with(n, transport, algo, key, Link::Default)
}

/// How a test world's links are set up beyond the transport.
#[derive(Clone, Copy)]
enum Link {
    Default,
    /// `GW_TRANSPORT=ofi` with this libfabric provider, rounds one-sided
    /// (`GW_ONE_SIDED=1`: the providers here emulate RMA, so `auto` would
    /// keep them two-sided).
    Ofi(&'static str),
    /// Rounds one-sided wherever the transport can (`GW_ONE_SIDED=1`).
    OneSided,
}

fn world_with(
    n: u32,
    transport: TransportChoice,
    algo: Option<Algo>,
    key: &str,
    link: Link,
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |_, cfg| {
        cfg.transport.set(transport);
        if algo.is_some() {
            cfg.algo.set(algo);
        }
        match link {
            Link::Default => {}
            Link::Ofi(p) => {
                cfg.ofi_provider.set(Some(p.into()));
                cfg.one_sided.set(OneSided::Always);
            }
            Link::OneSided => cfg.one_sided.set(OneSided::Always),
        }
        // Small segments: even 4099 elements are several pipelined messages.
        cfg.segment_bytes.set(4096);
    })
    .expect("communicators")
}

/// `rounds` rounds of one persistent all-reduce of `count` elements of `T`
/// with `op`, in place or not; the input changes every round.
fn rounds<T: Val>(
    c: &Communicator,
    count: usize,
    op: RedOp,
    in_place: bool,
    rounds: usize,
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let what = format!(
        "rank {r}/{n} {} {op:?} count {count} {}",
        std::any::type_name::<T>(),
        if in_place { "in place" } else { "out of place" }
    );
    let err = |e: Error| format!("{what}: {e}");
    let mut send = vec![T::of(0); count];
    let mut recv = vec![T::of(0); if in_place { 0 } else { count }];
    let mut req = if in_place {
        c.all_reduce_init_in_place(&mut send, op).map_err(err)?
    } else {
        c.all_reduce_init(&mut send, &mut recv, op).map_err(err)?
    };
    assert_eq!(req.in_place(), in_place);
    // Nothing started yet: the request is complete.
    if !req.test().map_err(err)? {
        return Err(format!("{what}: a request never started tests as running"));
    }
    for k in 0..rounds {
        fill(req.send_mut().map_err(err)?, op, r, k);
        req.start().map_err(err)?;
        if k % 2 == 0 {
            req.wait().map_err(err)?;
        } else {
            while !req.test().map_err(err)? {
                std::thread::yield_now();
            }
        }
        check(req.recv().map_err(err)?, op, n, k, &what)?;
        // The input of an out-of-place round is left as it was.
        if !in_place {
            let s = req.send_mut().map_err(err)?;
            if let Some(i) = (0..count).find(|&i| s[i] != T::of(input(op, r, k, i))) {
                return Err(format!("{what}: round {k} changed send element {i}"));
            }
        }
    }
    drop(req);
    let last = if in_place { &send } else { &recv };
    check(last, op, n, rounds - 1, &format!("{what} (after drop)"))
}

/// The matrix of one transport and world size: every count with float sums
/// in place and out of place, and a dtype × operator spread at odd counts.
fn matrix(transport: TransportChoice, n: u32, key: &str) {
    matrix_with(transport, n, key, Link::Default)
}

fn matrix_with(transport: TransportChoice, n: u32, key: &str, link: Link) {
    matrix_rounds(transport, n, key, link, ROUNDS)
}

/// [`matrix_with`], with `rounds` rounds of each small case.
fn matrix_rounds(transport: TransportChoice, n: u32, key: &str, link: Link, rounds_each: usize) {
    let (_store, comms) = world_with(n, transport, None, key, link);
    on_each_rank(comms, key, move |c| {
        for count in [1usize, 7, 4099] {
            rounds::<f32>(&c, count, RedOp::Sum, false, rounds_each)?;
            rounds::<f32>(&c, count, RedOp::Sum, true, rounds_each)?;
        }
        rounds::<f64>(&c, 7, RedOp::Max, false, rounds_each)?;
        rounds::<i32>(&c, 4099, RedOp::Min, true, rounds_each)?;
        rounds::<i64>(&c, 4099, RedOp::Prod, false, rounds_each)?;
        rounds::<f16>(&c, 1, RedOp::Sum, true, rounds_each)?;
        rounds::<bf16>(&c, 4099, RedOp::Prod, true, rounds_each)?;
        // A large message, cut into many segments. Fewer rounds: reuse is
        // covered above, and 50 rounds of 1024 segments at 8 ranks over
        // libfabric's tcp provider took 90 s of the suite on 2 cores.
        rounds::<f32>(&c, 1 << 20, RedOp::Sum, n.is_multiple_of(2), BIG_ROUNDS)?;
        Ok(())
    });
}

#[test]
fn tcp_1_2_3_ranks() {
    for n in [1, 2, 3] {
        matrix(TransportChoice::Tcp, n, &format!("ptcp{n}"));
    }
}

#[test]
fn tcp_4_and_8_ranks() {
    for n in [4, 8] {
        matrix(TransportChoice::Tcp, n, &format!("ptcp{n}"));
    }
}

#[test]
fn shm_1_2_3_ranks() {
    for n in [1, 2, 3] {
        matrix(TransportChoice::Shm, n, &format!("pshm{n}"));
    }
}

#[test]
fn shm_4_and_8_ranks() {
    for n in [4, 8] {
        matrix(TransportChoice::Shm, n, &format!("pshm{n}"));
    }
}

/// Over libfabric the rounds are one-sided writes (`fi_writedata`) into
/// the buffers published at init, with both providers that run here.
#[test]
fn ofi_1_2_3_ranks() {
    for n in [1, 2, 3] {
        for (p, name) in [("tcp;ofi_rxm", "tcp"), ("shm", "shm")] {
            let link = Link::Ofi(p);
            matrix_with(TransportChoice::Ofi, n, &format!("pofi{name}{n}"), link);
        }
    }
}

#[test]
fn ofi_4_and_8_ranks() {
    for n in [4, 8] {
        for (p, name) in [("tcp;ofi_rxm", "tcp"), ("shm", "shm")] {
            let rounds = if name == "shm" && n == 8 {
                SPINNING_ROUNDS
            } else {
                ROUNDS
            };
            let key = format!("pofi{name}{n}");
            matrix_rounds(TransportChoice::Ofi, n, &key, Link::Ofi(p), rounds);
        }
    }
}

/// `GW_ONE_SIDED=1`: rounds by one-sided writes into the peers' published
/// regions over shared memory (`auto` keeps shm two-sided).
#[test]
fn one_sided_persistent_over_shm() {
    for n in [2, 3, 4, 8] {
        matrix_with(TransportChoice::Shm, n, &format!("p1s{n}"), Link::OneSided);
    }
}

/// `GW_ONE_SIDED=1` over TCP: the same protocol, its writes carried over
/// the sockets (`FrameKind::Put`).
#[test]
fn one_sided_persistent_over_tcp() {
    for n in [2, 3, 4, 8] {
        matrix_with(TransportChoice::Tcp, n, &format!("p1t{n}"), Link::OneSided);
    }
}

#[test]
fn every_algorithm_runs_persistent() {
    for transport in [TransportChoice::Tcp, TransportChoice::Shm] {
        for algo in [Algo::Ring, Algo::Tree, Algo::Rhd, Algo::Rd] {
            let key = format!("palgo{}{}", transport.name(), algo.name());
            let (_store, comms) = world(4, transport, Some(algo), &key);
            on_each_rank(comms, &key, move |c| {
                rounds::<f32>(&c, 4099, RedOp::Sum, false, 20)?;
                rounds::<f64>(&c, 7, RedOp::Max, true, 20)
            });
        }
    }
}

/// Two persistent requests and ordinary collectives interleaved: rounds of
/// both requests in flight at once, blocking calls between rounds.
#[test]
fn persistent_rounds_mix_with_other_calls_and_requests() {
    let (_store, comms) = world(3, TransportChoice::Tcp, None, "pmix");
    on_each_rank(comms, "mix", |c| {
        let (r, n) = (c.rank(), c.size());
        let err = |e: Error| format!("rank {r}: {e}");
        let mut a = vec![0f32; 4099];
        let mut b_send = vec![0i64; 7];
        let mut b_recv = vec![0i64; 7];
        let mut ra = c
            .all_reduce_init_in_place(&mut a, RedOp::Sum)
            .map_err(err)?;
        let mut rb = c
            .all_reduce_init(&mut b_send, &mut b_recv, RedOp::Max)
            .map_err(err)?;
        for k in 0..ROUNDS {
            fill(ra.send_mut().map_err(err)?, RedOp::Sum, r, k);
            fill(rb.send_mut().map_err(err)?, RedOp::Max, r, k);
            ra.start().map_err(err)?;
            rb.start().map_err(err)?;
            if k % 3 == 0 {
                rb.wait().map_err(err)?;
                ra.wait().map_err(err)?;
            } else {
                ra.wait().map_err(err)?;
                rb.wait().map_err(err)?;
            }
            check(ra.recv().map_err(err)?, RedOp::Sum, n, k, "a")?;
            check(rb.recv().map_err(err)?, RedOp::Max, n, k, "b")?;
            let mut x = [r as f64 + 1.0; 5];
            c.all_reduce_in_place(&mut x, RedOp::Sum).map_err(err)?;
            let want = (n * (n + 1) / 2) as f64;
            if x != [want; 5] {
                return Err(format!("rank {r} round {k}: plain all_reduce gave {x:?}"));
            }
        }
        Ok(())
    });
}

/// Start while running, the buffers while running, wait with a timeout,
/// and dropping a running request (which waits for the round).
#[test]
fn misuse_is_refused_and_drop_waits_for_the_round() {
    let (_store, comms) = world(2, TransportChoice::Shm, None, "pmisuse");
    let gate = Arc::new(Barrier::new(2));
    on_each_rank(comms, "misuse", move |c| {
        let (r, n) = (c.rank(), c.size());
        let err = |e: Error| format!("rank {r}: {e}");
        let mut buf = vec![0f32; 1000];
        {
            let mut req = c
                .all_reduce_init_in_place(&mut buf, RedOp::Sum)
                .map_err(err)?;
            fill(req.send_mut().map_err(err)?, RedOp::Sum, r, 0);
            if r == 0 {
                // Rank 1 has not started: this round cannot finish yet.
                req.start().map_err(err)?;
                match req.start() {
                    Err(Error::InvalidUsage(m)) if m.contains("still running") => {}
                    other => return Err(format!("second start gave {other:?}")),
                }
                match req.send_mut() {
                    Err(Error::InvalidUsage(m)) if m.contains("running") => {}
                    other => return Err(format!("send_mut while running gave {other:?}")),
                }
                if req.recv().is_ok() || req.test().map_err(err)? {
                    return Err("the round finished without rank 1".into());
                }
                if req.wait_timeout(Duration::from_millis(50)).map_err(err)? {
                    return Err("wait_timeout saw the round finish without rank 1".into());
                }
                gate.wait();
            } else {
                gate.wait();
                req.start().map_err(err)?;
            }
            req.wait().map_err(err)?;
            // Waiting again on a finished round returns at once.
            req.wait().map_err(err)?;
            check(req.recv().map_err(err)?, RedOp::Sum, n, 0, "misuse round")?;
            // Round 1: rank 0 drops its request while the round runs; the
            // drop waits for rank 1, which starts late.
            fill(req.send_mut().map_err(err)?, RedOp::Sum, r, 1);
            if r == 1 {
                std::thread::sleep(Duration::from_millis(200));
            }
            req.start().map_err(err)?;
            if r == 1 {
                req.wait().map_err(err)?;
            }
        }
        check(&buf, RedOp::Sum, n, 1, "round finished by drop")?;
        // Mismatched lengths are refused before anything is planned.
        let mut short = [0f32; 3];
        match c.all_reduce_init(&mut buf, &mut short, RedOp::Sum) {
            Err(Error::InvalidArgument(m)) if m.contains("differ") => Ok(()),
            other => Err(format!("unequal buffers gave {:?}", other.map(|_| ()))),
        }
    });
}

/// Persistent reduce-scatter and all-gather: `ROUNDS` rounds each, inputs
/// changing every round, every element checked.
fn scatter_and_gather(c: &Communicator, count: usize) -> Result<(), String> {
    let (r, n) = (c.rank() as usize, c.size() as usize);
    let err = |e: Error| format!("rank {r}/{n} count {count}: {e}");
    let mut send = vec![0f32; n * count];
    let mut recv = vec![0f32; count];
    let mut rs = c
        .reduce_scatter_init(&mut send, &mut recv, RedOp::Sum)
        .map_err(err)?;
    for k in 0..ROUNDS {
        for (i, x) in rs.send_mut().map_err(err)?.iter_mut().enumerate() {
            *x = (r * 3 + i % 11 + k) as f32;
        }
        rs.start().map_err(err)?;
        rs.wait().map_err(err)?;
        for (j, &got) in rs.recv().map_err(err)?.iter().enumerate() {
            let i = r * count + j;
            let want: f32 = (0..n).map(|q| (q * 3 + i % 11 + k) as f32).sum();
            if got != want {
                return Err(format!(
                    "reduce_scatter rank {r} round {k} element {j}: {got} != {want}"
                ));
            }
        }
    }
    drop(rs);
    let mut mine = vec![0f32; count];
    let mut all = vec![0f32; n * count];
    let mut ag = c.all_gather_init(&mut mine, &mut all).map_err(err)?;
    for k in 0..ROUNDS {
        for (i, x) in ag.send_mut().map_err(err)?.iter_mut().enumerate() {
            *x = (r * 1000 + i + k) as f32;
        }
        ag.start().map_err(err)?;
        ag.wait().map_err(err)?;
        for (i, &got) in ag.recv().map_err(err)?.iter().enumerate() {
            let want = ((i / count) * 1000 + i % count + k) as f32;
            if got != want {
                return Err(format!(
                    "all_gather rank {r} round {k} element {i}: {got} != {want}"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn persistent_reduce_scatter_and_all_gather() {
    for (t, link, name) in [
        (TransportChoice::Tcp, Link::Default, "tcp"),
        (TransportChoice::Shm, Link::Default, "shm"),
        (TransportChoice::Ofi, Link::Ofi("tcp;ofi_rxm"), "ofi"),
    ] {
        for n in [1, 2, 3, 4] {
            let (_store, comms) = world_with(n, t, None, &format!("prsag{name}{n}"), link);
            on_each_rank(comms, name, |c| {
                for count in [1, 7, 5000] {
                    scatter_and_gather(&c, count)?;
                }
                Ok(())
            });
        }
    }
}

#[test]
fn persistent_reduce_scatter_and_all_gather_refuse_wrong_lengths() {
    let (_store, comms) = world(2, TransportChoice::Shm, None, "prsagbad");
    on_each_rank(comms, "lengths", |c| {
        let mut a = vec![0f32; 5];
        let mut b = vec![0f32; 3];
        let e = c
            .reduce_scatter_init(&mut a, &mut b, RedOp::Sum)
            .err()
            .ok_or("reduce_scatter_init took 5 into 3")?
            .to_string();
        if !e.contains("2 ranks × 3") {
            return Err(e);
        }
        let e = c
            .all_gather_init(&mut b, &mut a)
            .err()
            .ok_or("all_gather_init took 3 into 5")?
            .to_string();
        if !e.contains("2 ranks × 3") {
            return Err(e);
        }
        Ok(())
    });
}
