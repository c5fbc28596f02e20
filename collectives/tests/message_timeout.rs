//! A point-to-point message's timeout counts from when a caller waits for
//! it, as Gloo's does: a receive posted long before its send (pipeline
//! parallelism posts them early) is not a failure, while a waited receive
//! whose send never comes still times out, naming the message.

// Only its rank runner is used here.
#[allow(dead_code)]
mod common;

use common::on_each_rank;
use gw_collectives::local::local_world;
use gw_collectives::{DType, Error, TransportChoice};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(1);

fn early_receive(t: TransportChoice, key: &'static str) {
    let (_store, comms) = local_world(2, key, |_, cfg| {
        cfg.transport.set(t);
        cfg.timeout.set(TIMEOUT);
    })
    .expect("communicators");
    on_each_rank(comms, key, move |c| {
        let me = c.rank();
        let err = |e: Error| format!("{key} rank {me}: {e}");
        let mut got = vec![0u32; 1000];
        let data: Vec<u32> = (0..1000).collect();
        if me == 1 {
            // Posted now, sent 2.5 timeouts later, waited for after that.
            // SAFETY: got is untouched until the wait returns.
            let h = unsafe {
                c.sendrecv_raw(
                    DType::I32,
                    None,
                    Some((0, got.as_mut_ptr().cast(), got.len())),
                )
            }
            .map_err(err)?;
            std::thread::sleep(TIMEOUT * 3);
            h.wait().map_err(err)?;
            if got != data {
                return Err(format!("{key}: received {:?}…", &got[..4]));
            }
        } else {
            std::thread::sleep(TIMEOUT * 5 / 2);
            // SAFETY: data outlives the blocking wait.
            unsafe {
                c.sendrecv_raw(
                    DType::I32,
                    Some((1, data.as_ptr().cast(), data.len())),
                    None,
                )
            }
            .map_err(err)?
            .wait()
            .map_err(err)?;
        }
        // The communicator is still whole.
        c.barrier().map_err(err)?;
        Ok(())
    });
}

#[test]
fn a_receive_posted_long_before_its_send_succeeds_shm() {
    early_receive(TransportChoice::Shm, "early-recv-shm");
}

#[test]
fn a_receive_posted_long_before_its_send_succeeds_tcp() {
    early_receive(TransportChoice::Tcp, "early-recv-tcp");
}

#[test]
fn a_waited_receive_whose_send_never_comes_times_out() {
    let key = "late-recv-shm";
    let (_store, comms) = local_world(2, key, |_, cfg| {
        cfg.transport.set(TransportChoice::Shm);
        cfg.timeout.set(TIMEOUT);
    })
    .expect("communicators");
    on_each_rank(comms, key, move |c| {
        let me = c.rank();
        if me == 1 {
            let mut got = vec![0u32; 10];
            let t0 = Instant::now();
            // SAFETY: got is untouched until the wait returns.
            let r = unsafe {
                c.sendrecv_raw(
                    DType::I32,
                    None,
                    Some((0, got.as_mut_ptr().cast(), got.len())),
                )
            }
            .and_then(|h| h.wait());
            let waited = t0.elapsed();
            match r {
                Err(Error::Timeout { what, .. }) if waited >= TIMEOUT => {
                    if !what.contains("rank 1") {
                        return Err(format!("the timeout does not name the rank: {what}"));
                    }
                    Ok(())
                }
                other => Err(format!("after {waited:?}: {other:?}")),
            }
        } else {
            // Rank 0 sends nothing; it outlives rank 1's timeout.
            std::thread::sleep(TIMEOUT * 3);
            Ok(())
        }
    });
}
