//! Each thread keeps the last collective plan per communicator for the
//! next identical call (`kept_plan.rs`). These tests change everything a
//! plan is made of between calls, and the buffers with every call, and
//! check that each result is still right, that a bad call is refused
//! however often the same good call came before it, and that a thread
//! alternating between communicators gets each one's plan.

mod common;

use common::{expected, input, on_each_rank, right};
use gw_collectives::local::local_world;
use gw_collectives::{Communicator, DType, OpKind, RawOp, RedOp, TransportChoice};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every rank draws the same calls from the same seed, so they agree on
/// what runs.
const SEED: u64 = 0x6b65_7074;

/// One call of a small set, so that a plan is often found kept and as
/// often replaced: an all-reduce (sum or average), a weighted one, a
/// broadcast and a reduce from either of two roots, an all-gather.
fn one_call(c: &Communicator, rng: &mut StdRng, k: usize) -> Result<(), String> {
    let n = c.size();
    let r = c.rank();
    let count = [2usize, 2, 5, 300][rng.random_range(0..4)];
    let send: Vec<f32> = (0..count).map(|i| input(r, k, i)).collect();
    let root = rng.random_range(0..n.min(2));
    let e = |e: gw_collectives::Error| format!("call {k}: {e}");
    match rng.random_range(0..6) {
        0 | 1 => {
            let op = if rng.random_bool(0.5) {
                RedOp::Sum
            } else {
                RedOp::Avg
            };
            let mut recv = vec![f32::NAN; count];
            c.all_reduce(&send, &mut recv, op).map_err(e)?;
            for (i, &x) in recv.iter().enumerate() {
                if !right(op, n, k, i, x) {
                    return Err(format!(
                        "call {k}: all-reduce {op:?} of {count}: [{i}] = {x}"
                    ));
                }
            }
        }
        2 => {
            // A weight of 1 or 2 per rank: the sum, once or twice.
            let w = [1.0, 2.0][rng.random_range(0..2)];
            let mut recv = vec![f32::NAN; count];
            c.all_reduce_weighted(&send, &mut recv, w).map_err(e)?;
            for (i, &x) in recv.iter().enumerate() {
                let want = w as f32 * expected(n, k, i);
                if x != want {
                    return Err(format!("call {k}: weight {w}: [{i}] = {x}, not {want}"));
                }
            }
        }
        3 => {
            let mut buf = if r == root {
                send.clone()
            } else {
                vec![f32::NAN; count]
            };
            c.broadcast(&mut buf, root).map_err(e)?;
            for (i, &x) in buf.iter().enumerate() {
                if x != input(root, k, i) {
                    return Err(format!("call {k}: broadcast from {root}: [{i}] = {x}"));
                }
            }
        }
        4 => {
            let mut recv = vec![f32::NAN; count];
            c.reduce(&send, &mut recv, RedOp::Sum, root).map_err(e)?;
            if r == root {
                for (i, &x) in recv.iter().enumerate() {
                    if x != expected(n, k, i) {
                        return Err(format!("call {k}: reduce to {root}: [{i}] = {x}"));
                    }
                }
            }
        }
        _ => {
            let mut recv = vec![f32::NAN; count * n as usize];
            c.all_gather(&send, &mut recv).map_err(e)?;
            for (q, block) in recv.chunks(count).enumerate() {
                for (i, &x) in block.iter().enumerate() {
                    if x != input(q as u32, k, i) {
                        return Err(format!("call {k}: all-gather block {q}: [{i}] = {x}"));
                    }
                }
            }
        }
    }
    Ok(())
}

fn mixed_calls(t: TransportChoice, n: u32, key: &str) {
    let (_store, comms) =
        local_world(n, key, |_, cfg| cfg.transport.set(t)).expect("communicators");
    on_each_rank(comms, key, |c| {
        let mut rng = StdRng::seed_from_u64(SEED);
        (0..400).try_for_each(|k| one_call(&c, &mut rng, k))
    });
}

#[test]
fn calls_whose_arguments_change_between_them_stay_right_over_shm() {
    mixed_calls(TransportChoice::Shm, 2, "kept-shm-2");
    mixed_calls(TransportChoice::Shm, 3, "kept-shm-3");
}

#[test]
fn calls_whose_arguments_change_between_them_stay_right_over_tcp() {
    mixed_calls(TransportChoice::Tcp, 2, "kept-tcp-2");
    mixed_calls(TransportChoice::Tcp, 3, "kept-tcp-3");
}

/// A raw all-reduce of 4 floats at `send` into `recv`.
fn raw_all_reduce(send: *const u8, recv: *mut u8) -> RawOp {
    RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::F32,
        redop: RedOp::Sum,
        count: 4,
        root: 0,
        send,
        recv,
        weight: None,
    }
}

/// Runs `bad` on this rank alone and wants it refused with `words` in the
/// message; a refused call reaches no peer.
fn refused(what: &str, words: &str, bad: gw_collectives::Result<()>) -> Result<(), String> {
    match bad {
        Ok(()) => Err(format!("{what} was accepted")),
        Err(e) if e.to_string().contains(words) => Ok(()),
        Err(e) => Err(format!("{what}: {e} (wanted \"{words}\")")),
    }
}

#[test]
fn a_bad_call_is_refused_after_the_same_good_one() {
    let (_store, comms) = local_world(2, "kept-bad", |_, cfg| {
        cfg.transport.set(TransportChoice::Shm)
    })
    .expect("communicators");
    on_each_rank(comms, "kept-bad", |c| {
        let mut buf = [1.0f32; 4];
        for _ in 0..3 {
            c.broadcast(&mut buf, 1).map_err(|e| e.to_string())?;
        }
        refused(
            "a broadcast from rank 5 of 2",
            "root 5 is not a rank",
            c.broadcast(&mut buf, 5),
        )?;
        let send = [2.0f32; 4];
        let mut recv = [0.0f32; 4];
        let good = raw_all_reduce(send.as_ptr().cast(), recv.as_mut_ptr().cast());
        for _ in 0..3 {
            // SAFETY: both buffers hold 4 floats and outlive the call.
            unsafe { c.run_raw(good, None) }.map_err(|e| e.to_string())?;
        }
        if recv != [4.0; 4] {
            return Err(format!("all-reduce gave {recv:?}"));
        }
        // The same call but for the operator, then the type: new plans
        // (a kept sum's kernel would give 4, not the average 2).
        let avg = RawOp {
            redop: RedOp::Avg,
            ..good
        };
        // SAFETY: as above.
        unsafe { c.run_raw(avg, None) }.map_err(|e| e.to_string())?;
        if recv != [2.0; 4] {
            return Err(format!("average after sum gave {recv:?}"));
        }
        let send64 = [2.0f64; 2];
        let mut recv64 = [0.0f64; 2];
        let wide = RawOp {
            dtype: DType::F64,
            count: 2,
            ..raw_all_reduce(send64.as_ptr().cast(), recv64.as_mut_ptr().cast())
        };
        let narrow = RawOp {
            count: 2,
            ..raw_all_reduce(send.as_ptr().cast(), recv.as_mut_ptr().cast())
        };
        for op in [narrow, wide] {
            // SAFETY: both pairs of buffers hold at least 2 elements of
            // their type and outlive the calls.
            unsafe { c.run_raw(op, None) }.map_err(|e| e.to_string())?;
        }
        if recv64 != [4.0; 2] || recv[..2] != [4.0; 2] {
            return Err(format!("f32 then f64: {recv:?} {recv64:?}"));
        }
        // SAFETY: as above.
        unsafe { c.run_raw(good, None) }.map_err(|e| e.to_string())?;
        let null_send = raw_all_reduce(std::ptr::null(), recv.as_mut_ptr().cast());
        // SAFETY: refused before any buffer is touched.
        refused("a null send buffer", "null buffer", unsafe {
            c.run_raw(null_send, None)
        })?;
        let mut out = [0.0f32; 4];
        for _ in 0..3 {
            c.all_reduce_weighted(&send, &mut out, 0.5)
                .map_err(|e| e.to_string())?;
        }
        refused(
            "an infinite weight",
            "not finite",
            c.all_reduce_weighted(&send, &mut out, f64::INFINITY),
        )?;
        // The good calls still run, and agree across the ranks.
        // SAFETY: as above.
        unsafe { c.run_raw(good, None) }.map_err(|e| e.to_string())?;
        c.broadcast(&mut buf, 1).map_err(|e| e.to_string())?;
        if recv != [4.0; 4] || out != [2.0; 4] || buf != [1.0; 4] {
            return Err(format!("after refusals: {recv:?} {out:?} {buf:?}"));
        }
        Ok(())
    });
}

/// Plans are kept per thread for the last few communicators it called: a
/// thread that alternates the same all-gather between a 2-rank and a
/// 3-rank communicator (whose plans differ in the receive size) gets each
/// one's, every call right.
#[test]
fn a_thread_alternating_communicators_keeps_each_ones_plan() {
    let (_sa, a) = local_world(2, "kept-alt-a", |_, _| {}).expect("communicators");
    let (_sb, b) = local_world(3, "kept-alt-b", |_, _| {}).expect("communicators");
    let mut a: Vec<Option<Communicator>> = a.into_iter().map(Some).collect();
    let threads: Vec<_> = b
        .into_iter()
        .enumerate()
        .map(|(r, cb)| {
            let ca = a.get_mut(r).and_then(Option::take);
            std::thread::spawn(move || -> Result<(), String> {
                // Large enough for the engine, whose plan names its
                // communicator and its size.
                const COUNT: usize = 1024;
                let check = |c: &Communicator, k: usize| -> Result<(), String> {
                    let n = c.size() as usize;
                    let send = vec![c.rank() as f32 * 100.0 + k as f32; COUNT];
                    let mut recv = vec![f32::NAN; COUNT * n];
                    c.all_gather(&send, &mut recv)
                        .map_err(|e| format!("{n} ranks, call {k}: {e}"))?;
                    for (i, &x) in recv.iter().enumerate() {
                        if x != (i / COUNT) as f32 * 100.0 + k as f32 {
                            return Err(format!("{n} ranks, call {k}: element {i} is {x}"));
                        }
                    }
                    Ok(())
                };
                for k in 0..40 {
                    if let Some(ca) = &ca {
                        check(ca, k)?;
                    }
                    check(&cb, k)?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("rank thread").expect("alternating calls");
    }
}
