//! Work that a caller leaves for the engine thread is run without the
//! caller coming back. Where every rank has a core, a non-blocking post
//! does not wake the engine thread while it naps after a caller drove
//! (`drive.rs`); it must still run within the nap, not wait for a wait.
//!
//! Each round: both ranks make a blocking exchange (a caller drives, so the
//! engine thread naps), then rank 0 posts a send of a random size at once
//! (inside the nap) or after a pause (the thread parked again) and only
//! polls its handle, while rank 1 receives it blocking and checks it. A
//! lost wake-up shows as a round that lasts a park (a second) rather than
//! a nap (a millisecond): the median round must stay far below that. Over
//! shared memory and TCP, 2 ranks, many rounds.

// Only its rank runner is used here.
#[allow(dead_code)]
mod common;

use common::on_two_ranks;
use gw_collectives::{DType, Error, TransportChoice};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const ROUNDS: usize = 40;
/// The most a message may take to arrive in a median round: a quarter of
/// the engine thread's longest park, hundreds of naps.
const MEDIAN_MAX: Duration = Duration::from_millis(250);
/// How long rank 0 waits for a send it never waits on before calling it lost.
const GIVE_UP: Duration = Duration::from_secs(20);

fn byte(round: usize, i: usize) -> u8 {
    ((round * 31 + i * 7) % 251) as u8
}

fn check(t: TransportChoice, key: &'static str) {
    on_two_ranks(t, key, move |c| {
        let me = c.rank();
        let peer = 1 - me;
        let err = |e: Error| format!("{key} rank {me}: {e}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x6a6e + u64::from(me));
        let mut took = Vec::with_capacity(ROUNDS);
        for round in 0..ROUNDS {
            // Both ranks draw the same size from the round number.
            let size = 1 + (round * 7919 + 13) % (3 << 20);
            let mut token = [0u8; 8];
            c.sendrecv(&[round as u8; 8], peer, &mut token, peer)
                .map_err(err)?;
            if me == 0 {
                let data: Vec<u8> = (0..size).map(|i| byte(round, i)).collect();
                if rng.random_bool(0.5) {
                    std::thread::sleep(Duration::from_millis(rng.random_range(2..6)));
                }
                // SAFETY: `data` is neither moved nor touched until the
                // handle is complete.
                let h =
                    unsafe { c.sendrecv_raw(DType::U8, Some((peer, data.as_ptr(), size)), None) }
                        .map_err(err)?;
                let t0 = Instant::now();
                let res = loop {
                    if let Some(r) = h.test() {
                        break r;
                    }
                    if t0.elapsed() > GIVE_UP {
                        return Err(format!(
                            "{key} round {round}: a {size}-byte send nobody waited for never finished"
                        ));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                };
                res.map_err(err)?;
            } else {
                let mut got = vec![0u8; size];
                let t0 = Instant::now();
                c.recv(peer, &mut got).map_err(err)?;
                took.push(t0.elapsed());
                if let Some(i) = (0..size).find(|&i| got[i] != byte(round, i)) {
                    return Err(format!(
                        "{key} round {round}: byte {i} of {size} is {}, sent {}",
                        got[i],
                        byte(round, i)
                    ));
                }
            }
        }
        if me == 1 {
            took.sort();
            let median = took[took.len() / 2];
            if median > MEDIAN_MAX {
                return Err(format!(
                    "{key}: the median round took {median:?} for a send nobody waited for \
                     (more than {MEDIAN_MAX:?}: the engine thread was not woken); all: {took:?}"
                ));
            }
        }
        Ok(())
    });
}

#[test]
fn a_send_nobody_waits_for_runs_without_its_caller_shm() {
    check(TransportChoice::Shm, "handover_shm");
}

#[test]
fn a_send_nobody_waits_for_runs_without_its_caller_tcp() {
    check(TransportChoice::Tcp, "handover_tcp");
}
