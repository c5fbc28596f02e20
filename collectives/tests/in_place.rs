//! Reductions that read received messages straight from the shared-memory
//! ring (`engine/in_place.rs`): every algorithm, several world sizes, random
//! sizes cut into many segments, in place and out of place, all-reduce and
//! reduce-scatter, each element checked.

mod common;

use common::{expected, input, on_each_rank, right};
use gw_collectives::local::local_world;
use gw_collectives::{Algo, Communicator, RedOp, TransportChoice, in_place_reads};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Small segments, so that one call is many messages of one ring slot each.
const SEGMENT_BYTES: usize = 1024;

fn world(n: u32, algo: Algo, key: &str) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |_, cfg| {
        cfg.transport.set(TransportChoice::Shm);
        cfg.algo.set(Some(algo));
        cfg.segment_bytes.set(SEGMENT_BYTES);
        // Every call runs its schedule on the engine (no direct path).
        cfg.inline.set(false);
    })
    .expect("communicators")
}

/// `calls` collectives of random sizes per rank (the same sequence on every
/// rank): all-reduces, some in place, some averaging, and reduce-scatters.
fn run(comms: Vec<Communicator>, calls: usize, seed: u64) {
    let n = comms.len() as u32;
    on_each_rank(comms, "rank", move |c| {
        let r = c.rank();
        let mut rng = StdRng::seed_from_u64(seed);
        for k in 0..calls {
            let count = rng.random_range(1..=6000usize);
            let op = if rng.random_bool(0.25) {
                RedOp::Avg
            } else {
                RedOp::Sum
            };
            let what = rng.random_range(0..3);
            let send: Vec<f32> = (0..count).map(|i| input(r, k, i)).collect();
            let (out, first) = match what {
                0 => {
                    let mut b = send;
                    c.all_reduce_in_place(&mut b, op)
                        .map_err(|e| e.to_string())?;
                    (b, 0)
                }
                1 => {
                    let mut b = vec![0.0f32; count];
                    c.all_reduce(&send, &mut b, op).map_err(|e| e.to_string())?;
                    (b, 0)
                }
                _ => {
                    // Each rank gets its `per` elements of n·per.
                    let per = count.div_ceil(n as usize);
                    let send: Vec<f32> = (0..per * n as usize).map(|i| input(r, k, i)).collect();
                    let mut b = vec![0.0f32; per];
                    c.reduce_scatter(&send, &mut b, op)
                        .map_err(|e| e.to_string())?;
                    (b, r as usize * per)
                }
            };
            for (j, &x) in out.iter().enumerate() {
                let i = first + j;
                if !right(op, n, k, i, x) {
                    return Err(format!(
                        "rank {r} call {k} (kind {what}, {op:?} of {count}): element {i} is {x}, sum {}",
                        expected(n, k, i)
                    ));
                }
            }
        }
        Ok(())
    });
}

#[test]
fn every_algorithm_reduces_straight_from_the_ring() {
    for algo in [Algo::Ring, Algo::Rhd, Algo::Tree, Algo::Rd] {
        let sizes: &[u32] = match algo {
            // Recursive halving and doubling need a power-of-two world.
            Algo::Rhd | Algo::Rd => &[2, 4],
            _ => &[2, 3, 4],
        };
        for &n in sizes {
            let key = format!("ip{}{n}", algo.name());
            let (_store, comms) = world(n, algo, &key);
            let before = in_place_reads();
            run(comms, 40, 7 * u64::from(n));
            // Other tests only add to the count, so a lower bound holds:
            // the calls were many messages each, most of them reduced
            // where they arrived.
            let reads = in_place_reads() - before;
            assert!(reads >= 40, "{algo:?} n={n}: only {reads} in-place reads");
        }
    }
}
