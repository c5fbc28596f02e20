//! All-to-all over real shared memory and TCP at 1, 2, 3 and 4 ranks:
//! equal blocks, then uneven blocks (zeros included) with displacements
//! that leave gaps, every element checked; the argument errors.

// Only its rank runner is used here.
#[allow(dead_code)]
mod common;

use common::on_each_rank;
use gw_collectives::local::local_world;
use gw_collectives::{DType, Error, TransportChoice};

/// What rank `from` sends rank `to`: `count(from, to)` elements.
fn count(from: usize, to: usize) -> usize {
    (from * 5 + to * 3) % 7 * 100 + (from + to) % 2
}

fn value(from: usize, to: usize, i: usize) -> i64 {
    (from as i64) << 40 | (to as i64) << 20 | i as i64
}

fn check(t: TransportChoice, n: u32, key: &'static str) {
    let (_store, comms) =
        local_world(n, key, |_, cfg| cfg.transport.set(t)).expect("communicators");
    on_each_rank(comms, key, move |c| {
        let (me, n) = (c.rank() as usize, c.size() as usize);
        let err = |e: Error| format!("{key} rank {me}: {e}");
        // Equal blocks.
        let send: Vec<i64> = (0..n * 3).map(|i| value(me, i / 3, i % 3)).collect();
        let mut recv = vec![0i64; n * 3];
        c.all_to_all(&send, &mut recv).map_err(err)?;
        for (i, &x) in recv.iter().enumerate() {
            if x != value(i / 3, me, i % 3) {
                return Err(format!(
                    "{key} rank {me}: equal block element {i} is {x:#x}"
                ));
            }
        }
        // Uneven blocks, a gap of 2 elements after each.
        let sc: Vec<usize> = (0..n).map(|p| count(me, p)).collect();
        let rc: Vec<usize> = (0..n).map(|p| count(p, me)).collect();
        let displs = |cs: &[usize]| {
            let mut d = Vec::new();
            let mut at = 0;
            for &c in cs {
                d.push(at);
                at += c + 2;
            }
            (d, at)
        };
        let (sd, slen) = displs(&sc);
        let (rd, rlen) = displs(&rc);
        let mut send = vec![-1i64; slen];
        for p in 0..n {
            for i in 0..sc[p] {
                send[sd[p] + i] = value(me, p, i);
            }
        }
        let mut recv = vec![-7i64; rlen];
        // SAFETY: both buffers cover every block and are distinct.
        unsafe {
            c.all_to_allv_raw(
                DType::I64,
                send.as_ptr().cast(),
                &sc,
                &sd,
                recv.as_mut_ptr().cast(),
                &rc,
                &rd,
            )
        }
        .map_err(err)?;
        for p in 0..n {
            for i in 0..rc[p] {
                if recv[rd[p] + i] != value(p, me, i) {
                    return Err(format!("{key} rank {me}: block from {p} element {i} wrong"));
                }
            }
            if recv[rd[p] + rc[p]..rd[p] + rc[p] + 2] != [-7, -7] {
                return Err(format!(
                    "{key} rank {me}: the gap after block {p} was written"
                ));
            }
        }
        // Argument errors, the same on every rank, before anything moves.
        let mut short = vec![0i64; n * 3 - 1];
        match c.all_to_all(&vec![0i64; n * 3], &mut short) {
            Err(Error::InvalidArgument(m)) if m.contains("equal blocks") => {}
            other => return Err(format!("{key}: unequal buffers gave {other:?}")),
        }
        Ok(())
    });
}

#[test]
fn all_to_all_over_shm() {
    check(TransportChoice::Shm, 1, "a2a-shm-1");
    check(TransportChoice::Shm, 2, "a2a-shm-2");
    check(TransportChoice::Shm, 3, "a2a-shm-3");
    check(TransportChoice::Shm, 4, "a2a-shm-4");
}

#[test]
fn all_to_all_over_tcp() {
    check(TransportChoice::Tcp, 2, "a2a-tcp-2");
    check(TransportChoice::Tcp, 3, "a2a-tcp-3");
    check(TransportChoice::Tcp, 4, "a2a-tcp-4");
}
