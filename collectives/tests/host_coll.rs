//! Small blocking collectives through the host region (`host_coll.rs`):
//! long random sequences of every collective, sizes on both sides of the
//! limit (so calls on the region and on the engine interleave), with
//! non-blocking calls and point-to-point messages between them, every
//! element checked, at 2, 3 and 4 ranks; a broadcast root that runs far
//! ahead; mismatched calls, a rank that never comes, an abort; and the
//! vote that keeps every rank off the region when one cannot use it.

#[allow(dead_code)] // only `on_each_rank` is used here
mod common;

use common::{agrees, fold, get, on_each_rank, put, shm_world, small};
use gw_collectives::{Communicator, Config, DType, Error, OpKind, RawOp, RedOp, TransportChoice};
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// What `GW_HOST_COLL_BYTES` is in these worlds.
const LIMIT: usize = 2048;

fn world(
    n: u32,
    key: &str,
    tweak: impl Fn(u32, &mut Config),
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    shm_world(n, key, |r, cfg| {
        cfg.host_coll_bytes.set(LIMIT);
        tweak(r, cfg);
    })
}

/// One random call, the same on every rank.
#[derive(Clone, Copy, Debug)]
struct Call {
    kind: OpKind,
    dtype: DType,
    op: RedOp,
    count: usize,
    root: u32,
    weighted: bool,
    /// Submitted without blocking, then waited for, or tested until done,
    /// right away.
    nonblocking: bool,
    /// Blocking on even ranks, non-blocking on odd ones (or the reverse).
    mixed: bool,
}

fn random_call(rng: &mut rand::rngs::StdRng, n: u32) -> Call {
    let kind = [
        OpKind::AllReduce,
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Barrier,
    ][rng.random_range(0..7)];
    let dtype = [DType::F32, DType::F64, DType::I32][rng.random_range(0..3)];
    let reduces = matches!(
        kind,
        OpKind::AllReduce | OpKind::Reduce | OpKind::ReduceScatter
    );
    let op = if !reduces {
        RedOp::None
    } else if dtype == DType::I32 {
        [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max][rng.random_range(0..4)]
    } else {
        RedOp::ALL[rng.random_range(0..5)]
    };
    // Mostly under the limit, now and then over it (the engine's).
    let per_rank = if kind == OpKind::ReduceScatter {
        n as usize
    } else {
        1
    };
    let max_elems = (LIMIT / dtype.size() / per_rank).max(1);
    let count = if kind == OpKind::Barrier {
        0
    } else if rng.random_bool(0.8) {
        rng.random_range(1..=max_elems)
    } else {
        rng.random_range(max_elems + 1..=max_elems * 3)
    };
    Call {
        kind,
        dtype,
        op,
        count,
        root: rng.random_range(0..n),
        weighted: kind == OpKind::AllReduce
            && op == RedOp::Sum
            && dtype != DType::I32
            && rng.random_bool(0.2),
        nonblocking: rng.random_bool(0.15),
        mixed: rng.random_bool(0.1),
    }
}

/// The buffers of call `k` on rank `r` of `n`: the send buffer filled.
struct Buffers {
    send: Vec<u8>,
    recv: Vec<u8>,
}

fn weight(q: u32) -> f64 {
    0.5 * f64::from(q + 1)
}

impl Buffers {
    fn new(call: &Call, k: usize, r: u32, n: u32) -> Buffers {
        let es = call.dtype.size();
        let nn = n as usize;
        let (send_elems, recv_elems) = match call.kind {
            OpKind::ReduceScatter => (call.count * nn, call.count),
            OpKind::AllGather => (call.count, call.count * nn),
            _ => (call.count, call.count),
        };
        let mut send = vec![0u8; send_elems * es];
        for i in 0..send_elems {
            put(call.dtype, &mut send, i, small(r, k, i));
        }
        Buffers {
            send,
            recv: vec![0u8; recv_elems * es],
        }
    }

    /// The call on these buffers.
    fn op(&mut self, call: &Call, r: u32) -> RawOp {
        RawOp {
            kind: call.kind,
            dtype: call.dtype,
            redop: call.op,
            count: call.count,
            root: call.root,
            send: self.send.as_ptr(),
            recv: self.recv.as_mut_ptr(),
            weight: call.weighted.then(|| weight(r)),
        }
    }

    /// Checks every element call `k` must have written on rank `r` of `n`.
    fn check(&self, call: &Call, k: usize, r: u32, n: u32) -> Result<(), String> {
        let want = |i: usize| -> Option<f64> {
            let all = |i: usize| (0..n).map(move |q| small(q, k, i));
            match call.kind {
                OpKind::AllReduce if call.weighted => {
                    Some((0..n).map(|q| weight(q) * small(q, k, i)).sum())
                }
                OpKind::AllReduce => Some(fold(call.op, all(i), n)),
                OpKind::Reduce => (r == call.root).then(|| fold(call.op, all(i), n)),
                OpKind::Broadcast => Some(small(call.root, k, i)),
                OpKind::AllGather => Some(small((i / call.count) as u32, k, i % call.count)),
                OpKind::ReduceScatter => {
                    let at = r as usize * call.count + i;
                    Some(fold(call.op, (0..n).map(|q| small(q, k, at)), n))
                }
                _ => None,
            }
        };
        for i in 0..self.recv.len() / call.dtype.size() {
            let Some(w) = want(i) else { continue };
            let got = get(call.dtype, &self.recv, i);
            if !agrees(got, w, call.op == RedOp::Avg || call.weighted) {
                return Err(format!(
                    "rank {r} call {k} {call:?} element {i}: {got}, want {w}"
                ));
            }
        }
        Ok(())
    }
}

/// Runs call `k` on `c` and checks every element it must have written.
fn run_call(c: &Communicator, call: &Call, k: usize) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let mut b = Buffers::new(call, k, r, n);
    let op = b.op(call, r);
    let what = |e: Error| format!("rank {r} call {k} {call:?}: {e}");
    // SAFETY: both buffers are sized by the layout table and outlive the
    // call (the non-blocking one is waited for before they go).
    unsafe {
        if call.nonblocking ^ (call.mixed && r % 2 == 1) {
            let h = c.submit_raw(op, None).map_err(what)?;
            if k.is_multiple_of(2) {
                h.wait().map_err(what)?;
            } else {
                loop {
                    match h.test() {
                        Some(res) => break res.map_err(what)?,
                        None => std::thread::yield_now(),
                    }
                }
            }
        } else {
            c.run_raw(op, None).map_err(what)?;
        }
    }
    b.check(call, k, r, n)
}

/// `calls` random calls (from `seed`, the same on every rank), with a
/// point-to-point exchange around the ring now and then.
fn random_sequence(c: &Communicator, seed: u64, calls: usize) -> Result<u64, String> {
    let (r, n) = (c.rank(), c.size());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let before = c.host_coll_rounds().ok_or("no host region")?;
    let mut eligible = 0u64;
    for k in 0..calls {
        let call = random_call(&mut rng, n);
        run_call(c, &call, k)?;
        let per_rank = if call.kind == OpKind::ReduceScatter {
            n as usize
        } else {
            1
        };
        if call.count * per_rank * call.dtype.size() <= LIMIT {
            eligible += 1;
        }
        if rng.random_bool(0.1) {
            let out = [r as u8; 5];
            let mut back = [0u8; 5];
            c.sendrecv(&out, (r + 1) % n, &mut back, (r + n - 1) % n)
                .map_err(|e| format!("rank {r} sendrecv after call {k}: {e}"))?;
            if back != [((r + n - 1) % n) as u8; 5] {
                return Err(format!("rank {r}: sendrecv got {back:?}"));
            }
        }
    }
    let ran = c.host_coll_rounds().ok_or("no host region")? - before;
    if ran != eligible {
        return Err(format!(
            "rank {r}: {ran} calls on the host region, {eligible} eligible"
        ));
    }
    Ok(ran)
}

#[test]
fn random_sequences_of_every_collective_are_right() {
    let seed = common::seed(0xc011_u64);
    for n in [2u32, 3, 4] {
        let key = format!("hc-rand{n}");
        let (_store, comms) = world(n, &key, |_, _| {});
        let calls = if n == 4 { 300 } else { 500 };
        on_each_rank(comms, &key, move |c| {
            random_sequence(&c, seed + u64::from(n), calls).map(|_| ())
        });
    }
}

/// A root broadcasting far more calls than there are slots while its
/// receivers dawdle: it runs ahead by the slots, then waits, and every
/// receiver gets every call's data.
#[test]
fn a_broadcast_root_runs_ahead_and_waits_for_slots() {
    let (_store, comms) = world(3, "hc-ahead", |_, _| {});
    on_each_rank(comms, "hc-ahead", |c| {
        let r = c.rank();
        for k in 0..200u32 {
            let mut buf = [if r == 0 { k } else { u32::MAX }; 3];
            let mut b = buf.map(|x| x as i32);
            if r != 0 && k % 40 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            c.broadcast(&mut b, 0)
                .map_err(|e| format!("rank {r} call {k}: {e}"))?;
            buf = b.map(|x| x as u32);
            if buf != [k; 3] {
                return Err(format!("rank {r} call {k}: got {buf:?}"));
            }
        }
        Ok(())
    });
}

/// Ranks in different collectives, or in the same one with another count,
/// each get a mismatch naming both calls; the region then refuses later
/// calls with the first error, on the engine's calls unharmed.
#[test]
fn mismatched_calls_are_named_and_stop_the_region() {
    let (_store, comms) = world(2, "hc-mismatch", |_, _| {});
    on_each_rank(comms, "hc-mismatch", |c| {
        let r = c.rank();
        let mut buf = [1.0f32; 4];
        let res = if r == 0 {
            c.all_reduce_in_place(&mut buf, RedOp::Sum)
        } else {
            c.broadcast(&mut buf, 0)
        };
        match res {
            Err(Error::Mismatch { local, remote, .. })
                if local.contains(if r == 0 { "all_reduce" } else { "broadcast" })
                    && remote.contains(if r == 0 { "broadcast" } else { "all_reduce" }) => {}
            other => return Err(format!("rank {r}: {other:?}")),
        }
        match c.all_reduce_in_place(&mut buf, RedOp::Sum) {
            Err(Error::InvalidUsage(m)) if m.contains("earlier error") => {}
            other => return Err(format!("rank {r} after the mismatch: {other:?}")),
        }
        // Larger than the region's slots: the engine, still fine.
        let mut big = vec![1.0f32; LIMIT];
        c.all_reduce_in_place(&mut big, RedOp::Sum)
            .map_err(|e| format!("rank {r}: the engine's all-reduce: {e}"))?;
        match big.iter().all(|&x| x == 2.0) {
            true => Ok(()),
            false => Err(format!(
                "rank {r}: the engine's all-reduce gave {:?}",
                &big[..3]
            )),
        }
    });
    let (_store, comms) = world(2, "hc-count", |_, _| {});
    on_each_rank(comms, "hc-count", |c| {
        let r = c.rank();
        let mut buf = vec![1.0f64; 2 + r as usize];
        match c.all_reduce_in_place(&mut buf, RedOp::Max) {
            Err(Error::Mismatch { local, remote, .. })
                if local.contains(&format!("{} double", 2 + r))
                    && remote.contains(&format!("{} double", 3 - r)) =>
            {
                Ok(())
            }
            other => Err(format!("rank {r}: {other:?}")),
        }
    });
    // A barrier against an all-reduce: the barrier's rank would otherwise
    // leave as soon as the other had posted anything.
    let (_store, comms) = world(2, "hc-barrier-vs", |_, _| {});
    on_each_rank(comms, "hc-barrier-vs", |c| {
        let r = c.rank();
        let mut buf = [1i32; 2];
        let res = if r == 0 {
            c.barrier()
        } else {
            c.all_reduce_in_place(&mut buf, RedOp::Sum)
        };
        match res {
            Err(Error::Mismatch { local, remote, .. })
                if local.contains(if r == 0 { "barrier" } else { "all_reduce" })
                    && remote.contains(if r == 0 { "all_reduce" } else { "barrier" }) =>
            {
                Ok(())
            }
            other => Err(format!("rank {r}: {other:?}")),
        }
    });
}

/// A rank that never reaches the call: the others fail after GW_TIMEOUT
/// naming it. An aborted communicator fails the next call at once.
#[test]
fn a_missing_rank_is_named_and_an_abort_stops_calls() {
    let (_store, comms) = world(3, "hc-missing", |_, cfg| {
        cfg.timeout.set(Duration::from_secs(2));
    });
    let gate = std::sync::Arc::new(std::sync::Barrier::new(3));
    on_each_rank(comms, "hc-missing", move |c| {
        let r = c.rank();
        if r != 2 {
            let mut buf = [1.0f32; 2];
            match c.all_reduce_in_place(&mut buf, RedOp::Sum) {
                Err(Error::Timeout { what, .. }) if what.contains("[2]") => {}
                other => return Err(format!("rank {r}: {other:?}")),
            }
        }
        gate.wait();
        c.abort();
        let mut one = [0u8; 1];
        match c.broadcast(&mut one, 0) {
            Err(Error::Aborted(_)) => Ok(()),
            other => Err(format!("rank {r} after abort: {other:?}")),
        }
    });
}

/// Counts that put one rank's call on the region and another's on the
/// engine: each would wait for the other until `GW_TIMEOUT` (60 s here),
/// and instead every rank gets a mismatch naming the engine's call and
/// the region's, at 2 and 3 ranks, blocking and not.
#[test]
fn a_call_on_the_region_against_one_on_the_engine_is_a_mismatch() {
    for (n, nonblocking) in [(2, false), (2, true), (3, false)] {
        let key = format!("hc-media{n}{}", u8::from(nonblocking));
        let (_store, comms) = world(n, &key, |_, cfg| cfg.timeout.set(Duration::from_secs(60)));
        // Each rank keeps its communicator until all were told: one gone
        // would tell the others that instead.
        let gate = std::sync::Arc::new(std::sync::Barrier::new(n as usize));
        on_each_rank(comms, &key, move |c| {
            let r = c.rank();
            // Rank 1's is larger than the region's slots.
            let on_engine = r == 1;
            let count = if on_engine { LIMIT } else { 4 };
            let started = std::time::Instant::now();
            let res = if nonblocking {
                c.iall_reduce(vec![1.0f32; count], RedOp::Sum, None)
                    .and_then(|p| p.wait().map(|_| ()))
            } else {
                c.all_reduce_in_place(&mut vec![1.0f32; count], RedOp::Sum)
            };
            let (mine, theirs) = match on_engine {
                true => (
                    format!("count={LIMIT}"),
                    "of 4 float (sum, root 0) on the host region",
                ),
                false => (
                    "of 4 float (sum, root 0) on the host region".into(),
                    "on the engine",
                ),
            };
            gate.wait();
            match res {
                Err(Error::Mismatch { local, remote, .. })
                    if local.contains(&mine) && remote.contains(theirs) =>
                {
                    // Well within GW_TIMEOUT: told, not timed out.
                    match started.elapsed() < Duration::from_secs(30) {
                        true => Ok(()),
                        false => Err(format!("rank {r}: told after {:?}", started.elapsed())),
                    }
                }
                other => Err(format!(
                    "rank {r} (n {n}, nonblocking {nonblocking}): {other:?}"
                )),
            }
        });
    }
}

/// A call between two identical ones went to the engine on one rank only
/// (non-blocking, so that rank goes on): the next call's round pairs two
/// calls that look the same but hold different collective numbers, which
/// the region's readers tell as a mismatch on both ranks. (Rank 0 may
/// instead see rank 1's engine call in its line first.)
#[test]
fn a_round_whose_numbers_differ_is_a_mismatch() {
    let key = "hc-numbers";
    let (_store, comms) = world(2, key, |_, cfg| cfg.timeout.set(Duration::from_secs(60)));
    let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
    on_each_rank(comms, key, move |c| {
        let r = c.rank();
        let mut small = [1.0f32; 4];
        let engine = match r {
            1 => Some(c.iall_reduce(vec![1.0f32; LIMIT], RedOp::Sum, None)),
            _ => None,
        };
        let res = c.all_reduce_in_place(&mut small, RedOp::Sum);
        // Rank 1's engine call never meets a partner: it is told too, by
        // its own stall check, and its wait returns.
        let engine = engine.map(|p| p.and_then(|p| p.wait()).map(|_| ()));
        // Both told before either communicator goes.
        gate.wait();
        // The same call but for its number, one apart.
        let number = |s: &str| s.rsplit_once('#').and_then(|(_, n)| n.parse::<u64>().ok());
        let told = match &res {
            Err(Error::Mismatch { local, remote, .. }) => {
                let (a, b) = (
                    local.rsplit_once(", collective"),
                    remote.rsplit_once(", collective"),
                );
                let numbers = a.map(|a| a.0) == b.map(|b| b.0)
                    && number(local)
                        .zip(number(remote))
                        .is_some_and(|(a, b)| a.abs_diff(b) == 1);
                numbers || (r == 0 && remote.contains("on the engine"))
            }
            _ => false,
        };
        if !told {
            return Err(format!("rank {r}: {res:?}"));
        }
        match engine {
            None => Ok(()),
            Some(Err(Error::Mismatch { remote, .. })) if remote.contains("on the host region") => {
                Ok(())
            }
            Some(other) => Err(format!("rank 1's engine call: {other:?}")),
        }
    });
}

/// One rank with `GW_HOST_COLL_BYTES=0`: no rank uses the region, and the
/// calls are right on the engine; with every rank willing, every rank does.
#[test]
fn every_rank_agrees_on_the_region() {
    for (key, off) in [("hc-vote-off", true), ("hc-vote-on", false)] {
        let (_store, comms) = world(3, key, move |r, cfg| {
            if off && r == 2 {
                cfg.host_coll_bytes.set(0);
            }
        });
        on_each_rank(comms, key, move |c| {
            let r = c.rank();
            if c.host_coll_rounds().is_some() == off {
                return Err(format!("rank {r}: region {:?}", c.host_coll_rounds()));
            }
            let mut x = [f64::from(r); 4];
            c.all_reduce_in_place(&mut x, RedOp::Sum)
                .map_err(|e| e.to_string())?;
            match x == [3.0; 4] {
                true => Ok(()),
                false => Err(format!("rank {r}: {x:?}")),
            }
        });
    }
    // Over TCP there is no region.
    let (_store, comms) = world(2, "hc-tcp", |_, cfg| {
        cfg.transport.set(TransportChoice::Tcp)
    });
    on_each_rank(comms, "hc-tcp", |c| match c.host_coll_rounds() {
        None => Ok(()),
        Some(n) => Err(format!("a host region over tcp ({n} rounds)")),
    });
}

/// Non-blocking calls on the region: more outstanding than there are slots
/// (posting reads this rank's own earlier rounds to free its slot), waited
/// for in reverse order; one rank blocking where another does not; a
/// handle dropped unwaited, completed by the calls after it.
#[test]
fn nonblocking_calls_complete_in_any_order() {
    let (_store, comms) = world(3, "hc-async", |_, _| {});
    on_each_rank(comms, "hc-async", |c| {
        let (r, n) = (c.rank(), c.size());
        let err = |e: Error| format!("rank {r}: {e}");
        // More than the 16 slots a rank has.
        let k = 40;
        let send: Vec<[f64; 3]> = (0..k).map(|i| [(i as f64) + f64::from(r); 3]).collect();
        let mut recv = vec![[0f64; 3]; k];
        let mut handles = Vec::new();
        for (s, o) in send.iter().zip(recv.iter_mut()) {
            let op = RawOp {
                kind: OpKind::AllReduce,
                dtype: DType::F64,
                redop: RedOp::Sum,
                count: 3,
                root: 0,
                send: s.as_ptr().cast(),
                recv: o.as_mut_ptr().cast(),
                weight: None,
            };
            // SAFETY: `send` and `recv` outlive every handle (all waited
            // for below).
            handles.push(unsafe { c.submit_raw(op, None) }.map_err(err)?);
        }
        for h in handles.iter().rev() {
            h.wait().map_err(err)?;
        }
        let tri = f64::from(n * (n - 1) / 2);
        for (i, o) in recv.iter().enumerate() {
            if *o != [(i as f64) * f64::from(n) + tri; 3] {
                return Err(format!("rank {r} call {i}: {o:?}"));
            }
        }
        // Rank 0 blocks, the others do not; then a handle dropped unwaited
        // (its buffers kept), completed by the broadcast after it.
        let mut x = [f64::from(r); 2];
        if r == 0 {
            c.all_reduce_in_place(&mut x, RedOp::Max).map_err(err)?;
        } else {
            let op = RawOp {
                kind: OpKind::AllReduce,
                dtype: DType::F64,
                redop: RedOp::Max,
                count: 2,
                root: 0,
                send: x.as_ptr().cast(),
                recv: x.as_mut_ptr().cast(),
                weight: None,
            };
            // SAFETY: `x` lives to the end; the broadcast below completes
            // this round first.
            drop(unsafe { c.submit_raw(op, None) }.map_err(err)?);
        }
        let mut b = [if r == 1 { 7u8 } else { 0 }; 4];
        c.broadcast(&mut b, 1).map_err(err)?;
        match (x, b) {
            (x, [7, 7, 7, 7]) if x == [f64::from(n - 1); 2] => Ok(()),
            other => Err(format!("rank {r}: {other:?}")),
        }
    });
}

/// A rank that aborts, or closes its communicator, while the others wait
/// for it in a call: they stop within a liveness check, naming it, long
/// before `GW_TIMEOUT`.
#[test]
fn the_others_stop_when_a_rank_aborts_or_closes() {
    for (key, abort) in [("hc-left-abort", true), ("hc-left-close", false)] {
        let (_store, comms) = world(3, key, |_, cfg| cfg.timeout.set(Duration::from_secs(30)));
        on_each_rank(comms, key, move |c| {
            let r = c.rank();
            if r == 2 {
                std::thread::sleep(Duration::from_millis(200));
                if abort {
                    c.abort();
                }
                return Ok(());
            }
            let t0 = std::time::Instant::now();
            let mut x = [1.0f32; 2];
            let want = if abort { "aborted" } else { "closed" };
            match c.all_reduce_in_place(&mut x, RedOp::Sum) {
                Err(Error::Remote { rank: 2, what, .. })
                    if what.contains(want) && t0.elapsed() < Duration::from_secs(10) =>
                {
                    Ok(())
                }
                other => Err(format!("rank {r} after {:?}: {other:?}", t0.elapsed())),
            }
        });
    }
}

/// Calls that read nothing on some rank (a broadcast's root, a reduce's
/// other ranks) return at once, and are checked against the others'
/// headers when they are there: two ranks that each think they are a
/// broadcast's root, or a broadcast's root against a reduce's other rank,
/// fail at that call or the next. A call finished before that keeps its result. A root given to an
/// all-reduce (which has none) is ignored, as on the engine.
#[test]
fn calls_that_read_nothing_are_checked_by_the_next_call() {
    for (key, second_is_reduce) in [("hc-two-roots", false), ("hc-bcast-reduce", true)] {
        let (_store, comms) = world(2, key, |_, _| {});
        on_each_rank(comms, key, move |c| {
            let r = c.rank();
            let mut ok = [f64::from(r); 2];
            let op = RawOp {
                kind: OpKind::AllReduce,
                dtype: DType::F64,
                redop: RedOp::Sum,
                count: 2,
                root: r,
                send: ok.as_ptr().cast(),
                recv: ok.as_mut_ptr().cast(),
                weight: None,
            };
            // SAFETY: `ok` outlives the handle, waited for below.
            let first = unsafe { c.submit_raw(op, None) }.map_err(|e| e.to_string())?;
            first
                .wait()
                .map_err(|e| format!("rank {r}: all-reduce with a root: {e}"))?;
            if ok != [1.0; 2] {
                return Err(format!("rank {r}: {ok:?}"));
            }
            let mut b = [r as u8; 4];
            let res = if second_is_reduce && r == 1 {
                let send = b;
                c.reduce(&send, &mut b, RedOp::Sum, 0)
            } else {
                c.broadcast(&mut b, if second_is_reduce { 0 } else { r })
            };
            // Found by that call if the peer's header was there already,
            // else by the next.
            if res.is_ok() {
                let mut x = [1u8];
                match c.all_reduce_in_place(&mut x, RedOp::Max) {
                    Err(Error::Mismatch { .. }) | Err(Error::Remote { .. }) => {}
                    other => return Err(format!("rank {r}: the next call gave {other:?}")),
                }
            } else if !matches!(res, Err(Error::Mismatch { .. })) {
                return Err(format!(
                    "rank {r}: the call that reads nothing gave {res:?}"
                ));
            }
            match first.wait() {
                Ok(()) => Ok(()),
                Err(e) => Err(format!("rank {r}: a finished call now says {e}")),
            }
        });
    }
}

/// A rank polling `test` on a non-blocking call finds that the rank it
/// waits for closed its communicator.
#[test]
fn a_test_loop_finds_a_rank_that_left() {
    let (_store, comms) = world(2, "hc-test-left", |_, cfg| {
        cfg.timeout.set(Duration::from_secs(30))
    });
    on_each_rank(comms, "hc-test-left", |c| {
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            return Ok(());
        }
        let mut x = [1.0f64; 2];
        let op = RawOp {
            kind: OpKind::AllReduce,
            dtype: DType::F64,
            redop: RedOp::Sum,
            count: 2,
            root: 0,
            send: x.as_ptr().cast(),
            recv: x.as_mut_ptr().cast(),
            weight: None,
        };
        // SAFETY: `x` outlives the handle.
        let h = unsafe { c.submit_raw(op, None) }.map_err(|e| e.to_string())?;
        let t0 = std::time::Instant::now();
        loop {
            match h.test() {
                None if t0.elapsed() < Duration::from_secs(10) => std::thread::yield_now(),
                Some(Err(Error::Remote { rank: 0, what, .. })) if what.contains("closed") => {
                    return Ok(());
                }
                other => return Err(format!("after {:?}: {other:?}", t0.elapsed())),
            }
        }
    });
}

/// A non-blocking call returns at once, as MPI's do, even with every slot
/// of the ring taken: each rank submits three rings' worth of calls of
/// varied sizes and only then sends the next rank the message it waits
/// for before it makes any of them (a chain, so each rank is as far ahead
/// of the next as it can be). Were a submit to wait for a slot, the ranks
/// would wait for each other until `GW_TIMEOUT`.
#[test]
fn a_nonblocking_call_never_waits_for_a_slot() {
    for n in [2, 3, 4] {
        let key = format!("hc-noslot{n}");
        let (_store, comms) = world(n, &key, |_, cfg| cfg.timeout.set(Duration::from_secs(20)));
        on_each_rank(comms, &key, |c| {
            let (r, n) = (c.rank(), c.size());
            let err = |e: Error| format!("rank {r}: {e}");
            // Three times the 16 slots a rank has; 1 to 50 elements.
            let k = 48;
            let len = |i: usize| 1 + i * 7 % 50;
            let send: Vec<Vec<i32>> = (0..k)
                .map(|i| (0..len(i)).map(|e| (i + e) as i32 + r as i32).collect())
                .collect();
            let mut recv: Vec<Vec<i32>> = (0..k).map(|i| vec![0; len(i)]).collect();
            let mut token = [0i32; 1];
            if r > 0 {
                c.recv(r - 1, &mut token).map_err(err)?;
            }
            let mut handles = Vec::new();
            for (s, o) in send.iter().zip(recv.iter_mut()) {
                let op = RawOp {
                    kind: OpKind::AllReduce,
                    dtype: DType::I32,
                    redop: RedOp::Sum,
                    count: s.len(),
                    root: 0,
                    send: s.as_ptr().cast(),
                    recv: o.as_mut_ptr().cast(),
                    weight: None,
                };
                // SAFETY: `send` and `recv` outlive every handle (all
                // waited for below).
                handles.push(unsafe { c.submit_raw(op, None) }.map_err(err)?);
            }
            if r + 1 < n {
                c.send(r + 1, &[42i32]).map_err(err)?;
            }
            // Some tested, then all waited for, out of order.
            for h in handles.iter().step_by(5) {
                if let Some(done) = h.test() {
                    done.map_err(err)?;
                }
            }
            for h in handles.iter().rev() {
                h.wait().map_err(err)?;
            }
            drop(handles);
            if r > 0 && token != [42] {
                return Err(format!("rank {r} received {token:?}"));
            }
            let tri = (n * (n - 1) / 2) as i32;
            for (i, o) in recv.iter().enumerate() {
                let want: Vec<i32> = (0..len(i))
                    .map(|e| (i + e) as i32 * n as i32 + tri)
                    .collect();
                if *o != want {
                    return Err(format!("rank {r} call {i}: {o:?}"));
                }
            }
            Ok(())
        });
    }
}

/// A barrier on the region lets no rank out before every rank is in: each
/// rank counts itself in, sometimes after a pause, and after the barrier
/// finds every rank counted, round after round, at 2, 3 and 4 ranks.
#[test]
fn a_barrier_lets_nobody_out_early() {
    for n in [2u32, 3, 4] {
        let key = format!("hc-barrier{n}");
        let (_store, comms) = world(n, &key, |_, _| {});
        let arrived = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        on_each_rank(comms, &key, move |c| {
            let r = c.rank();
            let before = c.host_coll_rounds().ok_or("no host region")?;
            let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(r) + 7);
            let rounds = 300;
            for k in 0..rounds {
                if rng.random_bool(0.05) {
                    std::thread::sleep(Duration::from_millis(rng.random_range(1..5)));
                }
                arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                c.barrier()
                    .map_err(|e| format!("rank {r} barrier {k}: {e}"))?;
                let seen = arrived.load(std::sync::atomic::Ordering::SeqCst);
                if seen < n as usize * (k + 1) {
                    return Err(format!(
                        "rank {r} left barrier {k} with {seen} arrivals counted"
                    ));
                }
            }
            let ran = c.host_coll_rounds().ok_or("no host region")? - before;
            if ran != rounds as u64 {
                return Err(format!("rank {r}: {ran} barriers on the host region"));
            }
            Ok(())
        });
    }
}

/// Many small calls in flight at once: each rank makes the same random
/// calls, but whether each blocks, and when its non-blocking ones are
/// tested, waited for (some with a short limit) or dropped unwaited, is
/// its own choice, with pauses now and then, and bursts where one rank
/// lags while the others run a ring ahead, so that calls queue for slots
/// (asserted). Every result is checked once
/// a last blocking call has completed everything before it. At 2, 3 and
/// 4 ranks.
#[test]
fn many_calls_in_flight_queue_and_complete_in_order() {
    let seed = common::seed(0xf11e_u64);
    for n in [2u32, 3, 4] {
        let key = format!("hc-flight{n}");
        let (_store, comms) = world(n, &key, |_, cfg| cfg.timeout.set(Duration::from_secs(60)));
        let queued = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let q = queued.clone();
        on_each_rank(comms, &key, move |c| {
            let r = c.rank();
            let mut calls = rand::rngs::StdRng::seed_from_u64(seed + u64::from(n));
            let mut mine = rand::rngs::StdRng::seed_from_u64(seed ^ (u64::from(r) << 32 | 0x5eed));
            let before = c.host_coll_rounds().ok_or("no host region")?;
            let mut done: Vec<(Call, usize, Box<Buffers>)> = Vec::new();
            let mut flying: Vec<(Call, usize, Box<Buffers>, gw_collectives::Handle)> = Vec::new();
            let total = 600;
            let mut eligible = 0u64;
            for k in 0..total {
                // Region-sized only: every one of them is a round.
                let mut call = random_call(&mut calls, n);
                call.count = call.count.min(
                    (LIMIT
                        / call.dtype.size()
                        / if call.kind == OpKind::ReduceScatter {
                            n as usize
                        } else {
                            1
                        })
                    .max(1),
                );
                if call.kind == OpKind::Barrier {
                    call.count = 0;
                }
                eligible += 1;
                // Every 100 calls one rank in turn falls 10 ms behind while
                // the others make the next 24 calls without blocking: more
                // than a ring of slots, so some queue whatever the timing.
                let laggard = (k / 100) as u32 % n;
                let burst = k % 100 < 24;
                if burst && r == laggard && k % 100 == 0 {
                    std::thread::sleep(Duration::from_millis(10));
                } else if mine.random_bool(0.02) {
                    std::thread::sleep(Duration::from_millis(mine.random_range(1..4)));
                }
                let what = |e: Error| format!("rank {r} call {k} {call:?}: {e}");
                let mut b = Box::new(Buffers::new(&call, k, r, n));
                let op = b.op(&call, r);
                if mine.random_bool(0.3) && !(burst && r != laggard) {
                    // SAFETY: the buffers are boxed and kept to the end.
                    unsafe { c.run_raw(op, None) }.map_err(what)?;
                    done.push((call, k, b));
                } else {
                    // SAFETY: as above; every handle is waited for, or
                    // dropped with its buffers kept until the last call.
                    let h = unsafe { c.submit_raw(op, None) }.map_err(what)?;
                    flying.push((call, k, b, h));
                }
                // Now and then: test some, wait for one (perhaps briefly),
                // drop one unwaited.
                if mine.random_bool(0.2) && !flying.is_empty() && !burst {
                    let i = mine.random_range(0..flying.len());
                    let (call, k, _, h) = &flying[i];
                    let res = match mine.random_range(0..3) {
                        0 => h.test().unwrap_or(Ok(())),
                        1 => h.wait_timeout(Duration::from_micros(50)).unwrap_or(Ok(())),
                        _ => h.wait(),
                    };
                    res.map_err(|e| format!("rank {r} call {k} {call:?}: {e}"))?;
                }
                if mine.random_bool(0.05) && !flying.is_empty() {
                    let i = mine.random_range(0..flying.len());
                    let (call, k, b, h) = flying.swap_remove(i);
                    drop(h);
                    done.push((call, k, b));
                }
            }
            // A last blocking call completes every round before it.
            c.barrier()
                .map_err(|e| format!("rank {r} last barrier: {e}"))?;
            for (call, k, b, h) in flying {
                h.wait()
                    .map_err(|e| format!("rank {r} call {k} {call:?}: {e}"))?;
                done.push((call, k, b));
            }
            for (call, k, b) in &done {
                b.check(call, *k, r, n)?;
            }
            let ran = c.host_coll_rounds().ok_or("no host region")? - before;
            if ran != eligible + 1 {
                return Err(format!("rank {r}: {ran} rounds, {} calls", eligible + 1));
            }
            q.fetch_add(c.host_coll_queued(), std::sync::atomic::Ordering::Relaxed);
            Ok(())
        });
        // The queue was used, or this test tests nothing new.
        let queued = queued.load(std::sync::atomic::Ordering::Relaxed);
        assert!(queued > 0, "{n} ranks: no call waited for its slot");
        println!("{n} ranks: {queued} calls queued for their slot");
    }
}

/// An in-place broadcast from rank 0 of `count` elements at `buf`.
fn broadcast_in_place(dtype: DType, count: usize, buf: *mut u8) -> RawOp {
    RawOp {
        kind: OpKind::Broadcast,
        dtype,
        redop: RedOp::None,
        count,
        root: 0,
        send: buf.cast_const(),
        recv: buf,
        weight: None,
    }
}

/// The other way round from `a_nonblocking_call_never_waits_for_a_slot`:
/// the root queues broadcasts and then blocks in a receive; the other rank
/// waits for all the broadcasts before it sends. The queued rounds must be
/// posted by the root's receive (MPI's progress rule: any call moves
/// non-blocking operations), not only by its next host-region call.
#[test]
fn queued_calls_are_posted_while_the_rank_waits_for_a_message() {
    for inline in [true, false] {
        let key = format!("hc-pump{}", u8::from(inline));
        let (_store, comms) = world(2, &key, |_, cfg| {
            cfg.timeout.set(Duration::from_secs(20));
            cfg.inline.set(inline);
        });
        on_each_rank(comms, &key, |c| {
            let r = c.rank();
            let err = |e: Error| format!("rank {r}: {e}");
            let k = 48;
            let mut bufs: Vec<[f32; 2]> = (0..k)
                .map(|i| if r == 0 { [i as f32, 1.0] } else { [0.0; 2] })
                .collect();
            let mut handles = Vec::new();
            for b in bufs.iter_mut() {
                let op = broadcast_in_place(DType::F32, 2, b.as_mut_ptr().cast());
                // SAFETY: `bufs` outlives every handle (all waited for).
                handles.push(unsafe { c.submit_raw(op, None) }.map_err(err)?);
            }
            let mut token = [0i32];
            if r == 0 {
                c.recv(1, &mut token).map_err(err)?;
            } else {
                for h in &handles {
                    h.wait().map_err(err)?;
                }
                c.send(0, &[7i32]).map_err(err)?;
            }
            for h in &handles {
                h.wait().map_err(err)?;
            }
            drop(handles);
            if r == 0 && token != [7] {
                return Err(format!("rank 0 received {token:?}"));
            }
            for (i, b) in bufs.iter().enumerate() {
                if *b != [i as f32, 1.0] {
                    return Err(format!("rank {r} broadcast {i}: {b:?}"));
                }
            }
            Ok(())
        });
    }
}

/// A rank whose queued call waits for a slot that a rank that aborted
/// will never free: a `test` loop on that call fails within a liveness
/// check, naming the rank, long before `GW_TIMEOUT`. Broadcasts from this
/// rank: its own rounds read nothing, so only the slot's wait can notice.
#[test]
fn a_test_loop_on_a_queued_call_finds_a_rank_that_left() {
    let (_store, comms) = world(2, "hc-queued-left", |_, cfg| {
        cfg.timeout.set(Duration::from_secs(30))
    });
    let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
    on_each_rank(comms, "hc-queued-left", move |c| {
        let r = c.rank();
        if r == 1 {
            // Posts nothing: rank 0's rounds stay unread, its ring full.
            gate.wait();
            c.abort();
            return Ok(());
        }
        let mut bufs = vec![[1f64; 2]; 20];
        let mut handles = Vec::new();
        let mut res = Ok(());
        for b in bufs.iter_mut() {
            let op = broadcast_in_place(DType::F64, 2, b.as_mut_ptr().cast());
            // SAFETY: `bufs` outlives every handle.
            match unsafe { c.submit_raw(op, None) } {
                Ok(h) => handles.push(h),
                Err(e) => {
                    res = Err(format!("rank 0 submit: {e}"));
                    break;
                }
            }
        }
        gate.wait();
        res?;
        let last = handles.last().ok_or("no handle")?;
        let t0 = std::time::Instant::now();
        let got = loop {
            if let Some(done) = last.test() {
                break done;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err("the test loop never found rank 1 gone".into());
            }
            std::thread::yield_now();
        };
        match got {
            Err(Error::Remote { rank: 1, what, .. }) if what.contains("aborted") => Ok(()),
            other => Err(format!("rank 0: the queued call gave {other:?}")),
        }
    });
}
