//! The weighted all-reduce of unequal-batch local mean gradients equals the
//! gradient of the whole global batch: two ranks run in this process (two
//! communicators on threads, over TCP, with a store run by the test), split
//! the batch unevenly, and combine with r_i = b_i / B exactly as the worker
//! does, for the automatic algorithm and every forced one.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, TransportChoice};
use gw_rendezvous::StoreServer;
use gw_train::data::Dataset;
use gw_train::mlp::Mlp;
use gw_train::worker::{local_gradient, reduce_weighted};

fn comms(world: u32, key: &str) -> (StoreServer, Vec<Communicator>) {
    local_world(world, key, |_, cfg| cfg.transport.set(TransportChoice::Tcp))
        .expect("communicators")
}

#[test]
fn weighted_all_reduce_of_unequal_local_means_is_the_full_batch_gradient() {
    let mlp = Mlp::new(&[16, 24, 5]).expect("dims");
    let data = Dataset::new(11, 16, 5);
    let params = mlp.init(11);
    let n = mlp.len();
    let (global, first) = (64u64, 1000u64);

    // The reference: the mean gradient over all 64 samples, in one process.
    let mut full = vec![0.0; n];
    let mut ws = mlp.workspace();
    local_gradient(
        &mlp,
        &data,
        &params,
        first,
        global,
        1,
        &mut full,
        &mut [],
        &mut ws,
    );
    for v in &mut full {
        *v /= global as f64;
    }

    let (_store, comms) = comms(2, "weighted");
    let splits = [13u64, 51];
    for algo in ["auto", "ring", "tree", "rhd"] {
        let results: Vec<Vec<f64>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    let (mlp, data, params) = (&mlp, &data, &params);
                    s.spawn(move || {
                        let b = splits[r];
                        let off: u64 = splits[..r].iter().sum();
                        let mut g = vec![0.0; mlp.len()];
                        let mut ws = mlp.workspace();
                        local_gradient(
                            mlp,
                            data,
                            params,
                            first + off,
                            b,
                            1,
                            &mut g,
                            &mut [],
                            &mut ws,
                        );
                        for v in &mut g {
                            *v /= b as f64;
                        }
                        reduce_weighted(c, &mut g, b as f64 / global as f64, algo)
                            .expect("all-reduce");
                        g
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        });
        for (r, g) in results.iter().enumerate() {
            for i in 0..n {
                let err = (g[i] - full[i]).abs() / full[i].abs().max(1e-9);
                assert!(
                    err < 1e-10,
                    "{algo}, rank {r}, element {i}: {} vs full batch {}",
                    g[i],
                    full[i]
                );
            }
        }
        assert_eq!(results[0], results[1], "{algo}: ranks disagree");
    }
    // An unknown algorithm is an error, not a silent fallback.
    let mut g = vec![0.0; 4];
    assert!(reduce_weighted(&comms[0], &mut g, 1.0, "bogus").is_err());
}
