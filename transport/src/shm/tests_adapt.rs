//! The choice between a pull and the slots for each message the size rules
//! would pull, made from the costs both sides measured (see `costs.rs`).

use super::costs::{Costs, PROBE_EVERY, PathChoice, STORED_CHOICE_BYTES};
use super::tests::{cfg_pull, job, pattern, probed_pair, reg, run, send_hinted, tag};
use super::*;
use proptest::prelude::*;

/// Messages per run: two probes' worth, were they long enough to probe.
const MESSAGES: usize = 2 * PROBE_EVERY as usize;

/// Sends [`MESSAGES`] messages of 8 KiB from rank 0 to rank 1, which pulls
/// from 1000 bytes, with the costs of rank 0's choice set to `c` first;
/// checks every byte and returns how many were pulled. 8 KiB is under
/// what is timed, so the costs stay as set and no message is a probe
/// (`costs.rs` tests the probes).
fn pulled_of(name: &str, adaptive: bool, c: Costs) -> u64 {
    let (mut a, mut b) = probed_pair(ShmConfig {
        adaptive,
        ..cfg_pull(&job(name), 2, 16384, 1000)
    });
    b.peers[0]
        .conn
        .as_ref()
        .unwrap()
        .rx
        .set_costs(c.pull, c.slot_out);
    a.peers[1].conn.as_mut().unwrap().tx.set_in_cost(c.slot_in);
    let n = 8192;
    let mut src = pattern(n, 3);
    let mut dst = vec![0u8; n * MESSAGES];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    // One at a time: a message beyond its credits keeps its pull (see
    // `slots_free_for`), which the last test here shows.
    for i in 0..MESSAGES {
        let ra = a.isend(1, tag(1, i as u32), ms, 0, n).unwrap();
        let rb = b.irecv(0, tag(1, i as u32), md, i * n, n).unwrap();
        run(&mut a, &mut b, vec![ra], vec![rb]);
    }
    for (i, got) in dst.chunks(n).enumerate() {
        assert!(got == &src[..], "message {i} arrived wrong");
    }
    assert!(a.peers[1].pulls_out.is_empty());
    a.peers[1].next_pull
}

#[test]
fn slots_measured_cheaper_carry_every_message() {
    let c = Costs {
        pull: 300,
        slot_in: 40,
        slot_out: 50,
    };
    assert_eq!(pulled_of("adaptslots", true, c), 0);
    // Off, the size rules alone decide: every message is pulled.
    assert_eq!(pulled_of("adaptoff", false, c), MESSAGES as u64);
}

#[test]
fn pulls_measured_cheaper_or_unmeasured_costs_keep_every_message_pulled() {
    let cheap_pull = Costs {
        pull: 80,
        slot_in: 40,
        slot_out: 50,
    };
    assert_eq!(pulled_of("adaptpull", true, cheap_pull), MESSAGES as u64);
    let unknown = Costs {
        pull: 0,
        slot_in: 0,
        slot_out: 0,
    };
    assert_eq!(pulled_of("adaptunk", true, unknown), MESSAGES as u64);
}

#[test]
fn exchanges_and_short_stored_messages_keep_their_pulls_however_cheap_the_slots() {
    // An exchange at any size, and a stored message under
    // STORED_CHOICE_BYTES: of hinted messages only long stored ones are
    // chosen by cost (the next test).
    for (i, hint) in [SendHint::Exchanged, SendHint::Stored]
        .into_iter()
        .enumerate()
    {
        let (mut a, mut b) = probed_pair(ShmConfig {
            adaptive: true,
            p2p_pull_bytes: 1000,
            ..cfg_pull(&job(&format!("adapthint{i}")), 2, 16384, 1000)
        });
        b.peers[0].conn.as_ref().unwrap().rx.set_costs(300, 50);
        a.peers[1].conn.as_mut().unwrap().tx.set_in_cost(40);
        let n = 8192;
        let mut src = pattern(n, 5);
        let mut dst = vec![0u8; 2 * n];
        let ms = reg(&mut a, &mut src);
        let md = reg(&mut b, &mut dst);
        send_hinted(&mut a, &mut b, &[(ms, n, Some(hint)), (ms, n, None)], md);
        assert!(dst.chunks(n).all(|got| got == &src[..]));
        assert_eq!(
            a.peers[1].next_pull, 1,
            "{hint:?} pulled, the plain one not"
        );
    }
}

#[test]
fn long_stored_messages_go_by_cost_even_beyond_their_credits() {
    // Three stored messages of STORED_CHOICE_BYTES and one a byte shorter,
    // all posted at once: 16 frames each through 16 KiB slots, far beyond
    // the credits. Frames that short are not timed and no message is a
    // probe, so the costs stay as set, but for the pulls' own samples
    // where pulls are cheap (10 ps/B, which no sample lifts past the
    // slots' 90).
    let n = STORED_CHOICE_BYTES;
    let slot = 16384;
    for (i, (pull, want_pulled)) in [(300, 1), (10, 4)].into_iter().enumerate() {
        let (mut a, mut b) = probed_pair(ShmConfig {
            adaptive: true,
            p2p_pull_bytes: 1000,
            ..cfg_pull(&job(&format!("adaptstored{i}")), 2, slot, 1000)
        });
        assert!(a.peers[1].credits(usize::MAX) < n / slot);
        b.peers[0].conn.as_ref().unwrap().rx.set_costs(pull, 50);
        a.peers[1].conn.as_mut().unwrap().tx.set_in_cost(40);
        let mut src = pattern(n, 7 + i as u8);
        let mut dst = vec![0u8; 4 * n];
        let ms = reg(&mut a, &mut src);
        let md = reg(&mut b, &mut dst);
        let stored = Some(SendHint::Stored);
        send_hinted(
            &mut a,
            &mut b,
            &[
                (ms, n, stored),
                (ms, n, stored),
                (ms, n - 1, stored),
                (ms, n, stored),
            ],
            md,
        );
        let mut off = 0;
        for (k, len) in [n, n, n - 1, n].into_iter().enumerate() {
            assert!(
                dst[off..off + len] == src[..len],
                "message {k} arrived wrong"
            );
            off += len;
        }
        assert_eq!(
            a.peers[1].next_pull, want_pulled,
            "pulls at {pull} ps/B against slots at 40 + 50"
        );
    }
}

#[test]
fn messages_beyond_the_credits_are_pulled_however_cheap_the_slots() {
    // All posted at once: the first ones take the ring's credits, the
    // rest would be announced through the slots, and are pulled instead.
    let (mut a, mut b) = probed_pair(ShmConfig {
        adaptive: true,
        ..cfg_pull(&job("adaptcredits"), 2, 16384, 1000)
    });
    b.peers[0].conn.as_ref().unwrap().rx.set_costs(300, 50);
    a.peers[1].conn.as_mut().unwrap().tx.set_in_cost(40);
    let credits = a.peers[1].credits(usize::MAX) as u64;
    let n = 8192;
    let mut src = pattern(n, 4);
    let mut dst = vec![0u8; n * MESSAGES];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    send_hinted(&mut a, &mut b, &vec![(ms, n, None); MESSAGES], md);
    assert!(dst.chunks(n).all(|got| got == &src[..]));
    assert_eq!(a.peers[1].next_pull, MESSAGES as u64 - credits);
}

#[test]
fn real_copies_from_64_kib_are_measured_both_ways() {
    // One message pulled by the rules, one pushed through the slots: each
    // side's timed copy reaches the sender's figures.
    let (mut a, mut b) = probed_pair(cfg_pull(&job("adaptreal"), 2, 65536, 65536));
    let n = 65536;
    let mut src = pattern(n, 6);
    let mut dst = vec![0u8; 2 * n];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let none = Costs {
        pull: 0,
        slot_in: 0,
        slot_out: 0,
    };
    assert_eq!(a.peers[1].conn.as_ref().unwrap().tx.costs(), none);
    send_hinted(
        &mut a,
        &mut b,
        &[(ms, n, None), (ms, n, Some(SendHint::Pushed))],
        md,
    );
    assert!(dst.chunks(n).all(|got| got == &src[..]));
    assert_eq!(a.peers[1].next_pull, 1);
    let c = a.peers[1].conn.as_ref().unwrap().tx.costs();
    assert!(c.pull > 0 && c.slot_in > 0 && c.slot_out > 0, "{c:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Costs that flip from one message to the next, some messages long
    /// enough to be timed and so to probe: each message goes the way its
    /// costs and the probes say, and every byte arrives.
    #[test]
    fn messages_go_the_way_their_costs_say_and_arrive_whole(
        msgs in prop::collection::vec((1usize..200_000, any::<bool>()), 1..80),
    ) {
        let slot = 65536;
        let (mut a, mut b) = probed_pair(ShmConfig {
            adaptive: true,
            ..cfg_pull(&job("adaptmix"), 2, slot, 1000)
        });
        let total: usize = msgs.iter().map(|m| m.0).sum();
        let mut src = pattern(total, 9);
        let mut dst = vec![0u8; total];
        let ms = reg(&mut a, &mut src);
        let md = reg(&mut b, &mut dst);
        let mut mirror = PathChoice::default();
        let mut want_pulls = 0;
        let mut off = 0;
        for (i, &(n, slots_cheaper)) in msgs.iter().enumerate() {
            // Close enough that probes come every 32 or 64 messages
            // (`PathChoice::pull` spaces them by the ratio).
            let c = if slots_cheaper {
                Costs { pull: 40, slot_in: 10, slot_out: 10 }
            } else {
                Costs { pull: 10, slot_in: 10, slot_out: 5 }
            };
            // Set before each message: what the last one measured is
            // replaced, so the choice is this message's costs and probes.
            b.peers[0].conn.as_ref().unwrap().rx.set_costs(c.pull, c.slot_out);
            a.peers[1].conn.as_mut().unwrap().tx.set_in_cost(c.slot_in);
            if n >= 1000 && mirror.pull(c, n.min(slot)) {
                want_pulls += 1;
            }
            // One at a time, so that credits never decide.
            let t = tag(1, i as u32);
            let ra = a.isend(1, t, ms, off, n).unwrap();
            let rb = b.irecv(0, t, md, off, n).unwrap();
            run(&mut a, &mut b, vec![ra], vec![rb]);
            off += n;
        }
        prop_assert!(dst == src, "a message arrived wrong");
        prop_assert_eq!(a.peers[1].next_pull, want_pulls);
    }
}
