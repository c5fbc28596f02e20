//! Point-to-point messages run beside collectives, out of posting order,
//! but never out of order with an earlier operation on the same memory:
//! an `isend` of a buffer that a non-blocking all-reduce is still writing
//! sends the reduced values, and a non-blocking all-reduce of a buffer an
//! `irecv` is still filling reduces what arrived. Over shared memory and
//! TCP, 2 ranks, 4 MiB (so that starting early would read or write half
//! done buffers), several rounds. And a receive left waiting does not keep
//! a persistent round left for its `wait` from running.

// Only its rank runner is used here.
#[allow(dead_code)]
mod common;

use common::{on_each_rank, on_two_ranks};
use gw_collectives::local::local_world;
use gw_collectives::{DType, Error, OpKind, RawOp, RedOp, TransportChoice};
use std::time::{Duration, Instant};

const COUNT: usize = 1 << 20;
const ROUNDS: usize = 4;

fn all_reduce_in_place(buf: &mut [f32]) -> RawOp {
    RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::F32,
        redop: RedOp::Sum,
        count: buf.len(),
        root: 0,
        send: buf.as_ptr().cast(),
        recv: buf.as_mut_ptr().cast(),
        weight: None,
    }
}

fn check(t: TransportChoice, key: &'static str) {
    on_two_ranks(t, key, move |c| {
        let me = c.rank();
        let peer = 1 - me;
        let err = |e: Error| format!("{key} rank {me}: {e}");
        for round in 0..ROUNDS {
            let r = round as f32;
            // 1. Rank 0: all-reduce t, then isend t at once. Rank 1: the
            //    all-reduce, then receive. Rank 1 must get the sums.
            let mut t: Vec<f32> = (0..COUNT)
                .map(|i| (i % 97) as f32 + r + me as f32)
                .collect();
            let mut got = vec![0f32; COUNT];
            // SAFETY: t and got are neither moved nor touched until both
            // handles have been waited for.
            let (ar, p2p) = unsafe {
                let ar = c
                    .submit_raw(all_reduce_in_place(&mut t), None)
                    .map_err(err)?;
                let p2p = if me == 0 {
                    c.sendrecv_raw(DType::F32, Some((peer, t.as_ptr().cast(), COUNT)), None)
                } else {
                    c.sendrecv_raw(
                        DType::F32,
                        None,
                        Some((peer, got.as_mut_ptr().cast(), COUNT)),
                    )
                }
                .map_err(err)?;
                (ar, p2p)
            };
            ar.wait().map_err(err)?;
            p2p.wait().map_err(err)?;
            let sum = |i: usize| 2.0 * ((i % 97) as f32 + r) + 1.0;
            if me == 1
                && let Some(i) = (0..COUNT).find(|&i| got[i] != sum(i))
            {
                return Err(format!(
                    "{key} round {round}: element {i} sent after the all-reduce is {}, the sum is {}",
                    got[i],
                    sum(i)
                ));
            }
            // 2. Rank 0: irecv into u, then all-reduce u at once. Rank 1:
            //    a pause, the send, then the all-reduce of its own v. Rank
            //    0's all-reduce must reduce what arrived.
            let mut u = vec![-1f32; COUNT];
            let mut v: Vec<f32> = (0..COUNT).map(|i| (i % 89) as f32 * 2.0 + r).collect();
            if me == 0 {
                // SAFETY: as above, for u.
                let (rx, ar) = unsafe {
                    let rx = c
                        .sendrecv_raw(DType::F32, None, Some((peer, u.as_mut_ptr().cast(), COUNT)))
                        .map_err(err)?;
                    let ar = c
                        .submit_raw(all_reduce_in_place(&mut u), None)
                        .map_err(err)?;
                    (rx, ar)
                };
                rx.wait().map_err(err)?;
                ar.wait().map_err(err)?;
                let want = |i: usize| 2.0 * ((i % 89) as f32 * 2.0 + r);
                if let Some(i) = (0..COUNT).find(|&i| u[i] != want(i)) {
                    return Err(format!(
                        "{key} round {round}: element {i} of the all-reduce after the receive is {}, want {}",
                        u[i],
                        want(i)
                    ));
                }
            } else {
                std::thread::sleep(Duration::from_millis(50));
                c.send(peer, &v).map_err(err)?;
                c.all_reduce_in_place(&mut v, RedOp::Sum).map_err(err)?;
            }
        }
        Ok(())
    });
}

/// One test per transport: `$shm` and `$tcp` run `$check` with that
/// transport, under job keys made of `$key`.
macro_rules! on_shm_and_tcp {
    ($shm:ident, $tcp:ident, $check:ident, $key:literal) => {
        #[test]
        fn $shm() {
            $check(TransportChoice::Shm, concat!($key, "_shm"));
        }

        #[test]
        fn $tcp() {
            $check(TransportChoice::Tcp, concat!($key, "_tcp"));
        }
    };
}

on_shm_and_tcp!(
    messages_keep_their_order_with_operations_on_the_same_memory_shm,
    messages_keep_their_order_with_operations_on_the_same_memory_tcp,
    check,
    "message_order"
);

/// Rank 0 posts a receive, then starts a small persistent all-reduce (left
/// for its `wait`, see `deferred.rs`) and waits for the receive; rank 1
/// sends only after its own round of that all-reduce, which needs rank 0's.
/// The engine, kept from parking by the pending receive, must still run
/// rank 0's round once nothing has moved for its parking time.
fn deferred_round_beside_a_waiting_message(t: TransportChoice, key: &'static str) {
    let (_store, comms) = local_world(2, key, |_, cfg| {
        cfg.transport.set(t);
        cfg.timeout.set(Duration::from_secs(20));
    })
    .expect("communicators");
    on_each_rank(comms, key, move |c| {
        let me = c.rank();
        let peer = 1 - me;
        let err = |e: Error| format!("{key} rank {me}: {e}");
        let mut send = vec![me as f32 + 1.0; 16];
        let mut recv = vec![0f32; 16];
        let mut msg = vec![0f32; 8];
        let t0 = Instant::now();
        {
            let mut req = c
                .all_reduce_init(&mut send, &mut recv, RedOp::Sum)
                .map_err(err)?;
            if me == 0 {
                // SAFETY: msg is untouched until the receive is waited for.
                let rx = unsafe {
                    c.sendrecv_raw(DType::F32, None, Some((peer, msg.as_mut_ptr().cast(), 8)))
                }
                .map_err(err)?;
                req.start().map_err(err)?;
                rx.wait().map_err(err)?;
                req.wait().map_err(err)?;
            } else {
                req.start().map_err(err)?;
                req.wait().map_err(err)?;
                c.send(peer, &[7f32; 8]).map_err(err)?;
            }
        }
        if recv.iter().any(|x| *x != 3.0) || (me == 0 && msg.iter().any(|x| *x != 7.0)) {
            return Err(format!("{key} rank {me}: wrong results {recv:?} {msg:?}"));
        }
        let took = t0.elapsed();
        if took > Duration::from_secs(10) {
            return Err(format!("{key} rank {me}: took {took:?}"));
        }
        Ok(())
    });
}

on_shm_and_tcp!(
    a_waiting_message_does_not_hold_back_a_deferred_round_shm,
    a_waiting_message_does_not_hold_back_a_deferred_round_tcp,
    deferred_round_beside_a_waiting_message,
    "message_order_deferred"
);

/// Rank 1 posts windows of receives whose buffers overlap at random
/// offsets within one buffer, with random lengths (up to 40 KiB, so that
/// shared memory pulls some and slots others); rank 0 sends each message
/// filled with its own byte. Each receive must wait for the earlier ones
/// that write the same bytes, so every byte ends as the last message
/// covering it left it, and every held-back receive must start once the
/// one before it ends (a window of 48, each waiting on the last).
fn overlapping_receives_land_in_posting_order(t: TransportChoice, key: &'static str) {
    overlapping_receives(
        t,
        key,
        Shape {
            window: 48,
            buf: 64 << 10,
            max_len: 40 << 10,
            rounds: 6,
        },
    );
}

/// The same with messages of up to 1 MiB in a 2 MiB buffer: over shared
/// memory, those of 256 KiB or more go through the slots or are pulled as
/// the ring measured the two ways (`SendHint::Stored`), through the slots
/// even beyond their credits, announced; whichever way each takes, each
/// must land whole and in its turn.
fn long_overlapping_receives_land_in_posting_order(t: TransportChoice, key: &'static str) {
    overlapping_receives(
        t,
        key,
        Shape {
            window: 16,
            buf: 2 << 20,
            max_len: 1 << 20,
            rounds: 4,
        },
    );
}

/// A window of overlapping receives: how many, in how large a buffer, how
/// long each at most, how many windows.
#[derive(Clone, Copy)]
struct Shape {
    window: usize,
    buf: usize,
    max_len: usize,
    rounds: usize,
}

fn overlapping_receives(t: TransportChoice, key: &'static str, shape: Shape) {
    let Shape {
        window,
        buf: buf_len,
        max_len,
        rounds,
    } = shape;
    on_two_ranks(t, key, move |c| {
        let me = c.rank();
        let peer = 1 - me;
        let err = |e: Error| format!("{key} rank {me}: {e}");
        // The same draws on both ranks.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut draw = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize % n
        };
        for round in 0..rounds {
            let msgs: Vec<(usize, usize)> = (0..window)
                .map(|_| {
                    let len = 1 + draw(max_len);
                    (draw(buf_len - len + 1), len)
                })
                .collect();
            let fill = |i: usize| (1 + (round * window + i) % 250) as u8;
            if me == 0 {
                let bufs: Vec<Vec<u8>> = (0..window).map(|i| vec![fill(i); msgs[i].1]).collect();
                let mut handles = Vec::with_capacity(window);
                for b in &bufs {
                    // SAFETY: bufs is neither moved nor touched until every
                    // handle has been waited for.
                    let h = unsafe {
                        c.sendrecv_raw(DType::U8, Some((peer, b.as_ptr(), b.len())), None)
                    }
                    .map_err(err)?;
                    handles.push(h);
                }
                for h in handles {
                    h.wait().map_err(err)?;
                }
                continue;
            }
            let mut buf = vec![0u8; buf_len];
            let base = buf.as_mut_ptr();
            let mut handles = Vec::with_capacity(window);
            for &(off, n) in &msgs {
                // SAFETY: buf is neither moved nor touched until every
                // handle has been waited for.
                let h = unsafe { c.sendrecv_raw(DType::U8, None, Some((peer, base.add(off), n))) }
                    .map_err(err)?;
                handles.push(h);
            }
            for h in handles {
                h.wait().map_err(err)?;
            }
            let mut want = vec![0u8; buf_len];
            for (i, &(off, n)) in msgs.iter().enumerate() {
                want[off..off + n].fill(fill(i));
            }
            if let Some(i) = (0..buf_len).find(|&i| buf[i] != want[i]) {
                return Err(format!(
                    "{key} round {round}: byte {i} is {}, the last message over it wrote {}",
                    buf[i], want[i]
                ));
            }
        }
        Ok(())
    });
}

on_shm_and_tcp!(
    overlapping_receives_land_in_posting_order_shm,
    overlapping_receives_land_in_posting_order_tcp,
    overlapping_receives_land_in_posting_order,
    "message_order_overlap"
);

on_shm_and_tcp!(
    long_overlapping_receives_land_in_posting_order_shm,
    long_overlapping_receives_land_in_posting_order_tcp,
    long_overlapping_receives_land_in_posting_order,
    "message_order_overlap_long"
);
