//! Pipeline depth over real transports: ranks on different hardware may pick
//! different depths (each window bounds only what its own side has posted),
//! so a world whose ranks each use another depth must give exact results on
//! both transports; and a depth out of range is refused at init, naming the
//! setting.

mod common;

use common::{expected, input, on_each_rank, right};
use gw_collectives::local::local_world;
use gw_collectives::{Algo, MAX_DEPTH, RedOp, TransportChoice};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Depth of rank `r`: the two defaults, a shallow one and the deepest.
fn depth_of(r: u32) -> usize {
    [1, 8, 2, MAX_DEPTH][r as usize % 4]
}

#[test]
fn ranks_with_different_depths_agree_exactly() {
    for transport in [TransportChoice::Tcp, TransportChoice::Shm] {
        for algo in [Algo::Ring, Algo::Tree, Algo::Rhd] {
            let n = 4;
            let key = format!("depth{transport:?}{}", algo.name());
            let (_store, comms) = local_world(n, &key, |r, cfg| {
                cfg.transport.set(transport);
                cfg.algo.set(Some(algo));
                // Many segments per call, so the windows matter.
                cfg.segment_bytes.set(1024);
                cfg.pipeline_depth.set(depth_of(r));
                cfg.inline.set(false);
            })
            .expect("communicators");
            on_each_rank(comms, &format!("{transport:?} {algo:?}"), move |c| {
                let r = c.rank();
                let mut rng = StdRng::seed_from_u64(11);
                for k in 0..30 {
                    let count = rng.random_range(1..=20_000usize);
                    let send: Vec<f32> = (0..count).map(|i| input(r, k, i)).collect();
                    let mut out = vec![0.0f32; count];
                    c.all_reduce(&send, &mut out, RedOp::Sum)
                        .map_err(|e| e.to_string())?;
                    if let Some((i, x)) = out
                        .iter()
                        .enumerate()
                        .find(|&(i, &x)| !right(RedOp::Sum, n, k, i, x))
                    {
                        return Err(format!(
                            "rank {r} (depth {}) call {k} of {count}: element {i} is {x}, sum {}",
                            depth_of(r),
                            expected(n, k, i)
                        ));
                    }
                }
                Ok(())
            });
        }
    }
}

#[test]
fn a_depth_out_of_range_is_refused_at_init() {
    for bad in [0, MAX_DEPTH + 1] {
        let key = format!("baddepth{bad}");
        let e = local_world(2, &key, |_, cfg| cfg.pipeline_depth.set(bad))
            .err()
            .unwrap_or_else(|| panic!("depth {bad} was accepted"))
            .to_string();
        assert!(
            e.contains(&format!(
                "pipeline depth {bad} out of range 1..={MAX_DEPTH}"
            )) && e.contains("GW_PIPELINE_DEPTH"),
            "{e}"
        );
    }
}
