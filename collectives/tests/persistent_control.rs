//! A persistent all-reduce's round costs the same few control messages
//! whatever its size and however many rounds came before (GDRAA's O(1)
//! handshake): two small two-sided messages per ring neighbour (`Ready`
//! for the window, `Ready` for the receive buffer), and the data moves as
//! one-sided writes into buffers published once.
//!
//! The counts come from the engine (`gw_collectives::messages_posted`,
//! process-wide: every rank is a thread here), taken around one round at
//! 1 KiB and at 256 MiB, and at round 1 and round 1000, over shared memory
//! and over libfabric's `tcp;ofi_rxm`, one-sided by `GW_ONE_SIDED=1` (these
//! emulate RMA in software, so `auto` would keep them two-sided). Its own test binary, so that no
//! other test's messages are counted.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, OneSided, RedOp, TransportChoice, messages_posted};
use std::sync::{Arc, Barrier};

/// (sends, writes) all ranks posted in round `k` (1-based) of a persistent
/// all-reduce of `count` floats, for each `k` in `at`; the other rounds run
/// in between. Every round's result is checked.
fn per_round(comms: Vec<Communicator>, count: usize, at: &[usize]) -> Vec<(u64, u64)> {
    let n = comms.len();
    let last = *at.iter().max().expect("rounds");
    let gate = Arc::new(Barrier::new(n));
    let at: Arc<Vec<usize>> = Arc::new(at.to_vec());
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let (gate, at) = (gate.clone(), at.clone());
            std::thread::spawn(move || {
                let r = c.rank() as usize;
                let mut send = vec![0f32; count];
                let mut recv = vec![0f32; count];
                let mut req = c.all_reduce_init(&mut send, &mut recv, RedOp::Sum).unwrap();
                let mut seen = Vec::new();
                for k in 1..=last {
                    let v = (r + k % 5) as f32;
                    req.send_mut().unwrap().fill(v);
                    let counted = at.contains(&k);
                    if counted {
                        gate.wait();
                    }
                    let before = messages_posted();
                    if counted {
                        gate.wait();
                    }
                    req.start().unwrap();
                    req.wait().unwrap();
                    if counted {
                        gate.wait();
                        let after = messages_posted();
                        seen.push((after.0 - before.0, after.1 - before.1));
                        gate.wait();
                    }
                    let want: f32 = (0..n).map(|q| (q + k % 5) as f32).sum();
                    let got = req.recv().unwrap();
                    assert!(
                        got[0] == want && got[count - 1] == want && got[count / 2] == want,
                        "rank {r} round {k}: got {} want {want}",
                        got[0]
                    );
                }
                seen
            })
        })
        .collect();
    let all: Vec<Vec<(u64, u64)>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Every rank read the same window; rank 0's reading is the count.
    all.into_iter().next().unwrap()
}

fn world(
    transport: TransportChoice,
    n: u32,
    key: &str,
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |_, cfg| {
        cfg.transport.set(transport);
        cfg.ofi_provider.set(Some("tcp;ofi_rxm".into()));
        cfg.one_sided.set(OneSided::Always);
    })
    .unwrap()
}

fn check(transport: TransportChoice, n: u32) {
    let name = transport.name();
    // Two `Ready`s to each ring neighbour per rank: one neighbour at 2
    // ranks (both messages go to it), the left one beyond.
    let want_sends = 2 * u64::from(n);
    let (_s, comms) = world(transport, n, &format!("pc{name}{n}a"));
    let small = per_round(comms, 256, &[1, 1000]);
    let (_s, comms) = world(transport, n, &format!("pc{name}{n}b"));
    let big = per_round(comms, 64 << 20, &[1]);
    println!("{name} {n} ranks: 1 KiB rounds 1 and 1000 {small:?}, 256 MiB round 1 {big:?}");
    for (what, (sends, writes)) in [
        ("1 KiB, round 1", small[0]),
        ("1 KiB, round 1000", small[1]),
        ("256 MiB, round 1", big[0]),
    ] {
        assert_eq!(
            sends, want_sends,
            "{name} {n} ranks {what}: {sends} control messages in a round, want {want_sends}"
        );
        assert!(
            writes > 0,
            "{name} {n} ranks {what}: no one-sided write moved the data"
        );
    }
    assert_eq!(
        small[0], small[1],
        "{name}: round 1000 differs from round 1"
    );
    assert!(
        big[0].1 > small[0].1,
        "{name}: 256 MiB moved in no more writes than 1 KiB"
    );
}

/// One test: the counters are process-wide, so nothing else may run
/// beside it.
#[test]
fn control_messages_per_round_are_constant() {
    for transport in [
        TransportChoice::Shm,
        TransportChoice::Ofi,
        TransportChoice::Tcp,
    ] {
        check(transport, 2);
        check(transport, 3);
    }
}
