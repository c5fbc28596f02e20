//! A `sendrecv` with one peer is an exchange: its send may be copied out of
//! the sender's memory by the receiver however large its region
//! (`SendHint::Exchanged`), where other sends from regions of 4 MiB
//! or more go through the slots. Both must deliver every byte: exchanges of
//! sizes around that limit, in both directions at once, and a ring of
//! sendrecvs at 3 ranks (send and receive with different peers, not an
//! exchange) beside them. Over shared memory and TCP.

// Only its rank runner is used here.
#[allow(dead_code)]
mod common;

use common::on_each_rank;
use gw_collectives::local::local_world;
use gw_collectives::{Error, TransportChoice};

const SIZES: [usize; 5] = [
    64 << 10,
    (4 << 20) - 1,
    4 << 20,
    (4 << 20) + 1,
    (9 << 20) + 7,
];

fn byte(from: u32, size: usize, i: usize) -> u8 {
    ((from as usize * 89 + size + i * 13) % 253) as u8
}

fn check(t: TransportChoice, n: u32, key: &'static str) {
    let (_store, comms) =
        local_world(n, key, |_, cfg| cfg.transport.set(t)).expect("communicators");
    on_each_rank(comms, key, move |c| {
        let me = c.rank();
        let err = |e: Error| format!("{key} rank {me}: {e}");
        // With 2 ranks both halves go to the one peer (an exchange); with 3,
        // to the right and from the left.
        let to = (me + 1) % n;
        let from = (me + n - 1) % n;
        for round in 0..2 {
            for &size in &SIZES {
                let send: Vec<u8> = (0..size).map(|i| byte(me, size + round, i)).collect();
                let mut got = vec![0u8; size];
                c.sendrecv(&send, to, &mut got, from).map_err(err)?;
                if let Some(i) = (0..size).find(|&i| got[i] != byte(from, size + round, i)) {
                    return Err(format!(
                        "{key} rank {me}: byte {i} of {size} from rank {from} is {}, sent {}",
                        got[i],
                        byte(from, size + round, i)
                    ));
                }
            }
        }
        Ok(())
    });
}

#[test]
fn exchanges_around_the_region_limit_arrive_whole_shm() {
    check(TransportChoice::Shm, 2, "exchange_shm");
}

#[test]
fn exchanges_around_the_region_limit_arrive_whole_tcp() {
    check(TransportChoice::Tcp, 2, "exchange_tcp");
}

#[test]
fn a_ring_of_sendrecvs_beside_the_limit_arrives_whole_shm() {
    check(TransportChoice::Shm, 3, "exchange_ring_shm");
}
