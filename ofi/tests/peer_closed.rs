//! A peer endpoint in the same process closes while this one still has its
//! messages to progress: what a process running two ranks (the C ABI allows
//! several communicators a process, and gradwire's own tests run whole
//! worlds in one process) sees when one rank finishes first.
//!
//! libfabric 1.17's shm provider does not map the region of a peer in the
//! same process: it uses the peer endpoint's own mapping, which goes away
//! when that endpoint is closed, and the next progress call that touches
//! the peer (to answer a send it made) faults on it. gw-ofi therefore
//! keeps closed shm endpoints open until the process has none in use.

mod common;

use common::*;
use gw_ofi::*;
use std::time::{Duration, Instant};

fn peer_closes_with_messages_in_flight(prov: &str) {
    let Some((mut a, mut b, _, b_to_a)) = pair(prov) else {
        return;
    };
    // Larger than any inject or eager size, so that delivering them needs
    // the sender's side again (a rendezvous answer, a copy from its memory).
    const LEN: usize = 1 << 20;
    const MSGS: u64 = 4;
    let src = Buf::new(LEN);
    // SAFETY: src outlives its registration and every transfer from it.
    let smr = unsafe { b.ep.register(src.ptr(), LEN, FI_SEND) }.expect("register");
    for i in 0..MSGS {
        post_retry(&mut [&mut b, &mut a], "fi_send", |s| {
            // SAFETY: src is never modified.
            unsafe { s[0].ep.send(src.ptr(), LEN, smr.desc(), b_to_a, 100 + i) }
        });
        post_retry(&mut [&mut b, &mut a], "fi_inject", |s| {
            s[0].ep.inject(b"small", b_to_a)
        });
    }
    // Rank b is done and leaves; its buffer stays allocated (the process
    // lives on), only its endpoint and domain go.
    drop(smr);
    drop(b);
    let shm = prov == "shm";
    if shm {
        assert_eq!(
            lingering_endpoints(),
            1,
            "b's endpoint lingers while a's is open"
        );
    }

    let dst: Vec<Buf> = (0..MSGS + MSGS).map(|_| Buf::new(LEN)).collect();
    for (i, d) in dst.iter().enumerate() {
        // SAFETY: d is not touched until the end of the test, after the
        // endpoint that may write it is dropped.
        unsafe { a.ep.recv(d.ptr(), LEN, None, i as u64) }.expect("fi_recv");
    }
    // Progress for a while: every receive may complete or not (the sender
    // is gone), but progress must not fault or fail.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let mut out = [Completion::default(); 16];
        if let Err(e) = a.ep.poll_cq(&mut out) {
            // A provider may report the sends of a peer that left as
            // failed receives; that is an answer, not a fault.
            println!("{prov}: a completion after the peer left: {e}");
        }
    }
    drop(a);
    drop(dst);
    if shm {
        // The last one closed takes the lingering one along: both regions
        // are gone from /dev/shm (named pid:uid:index by the provider).
        assert_eq!(lingering_endpoints(), 0);
        let mine = format!("{}:", std::process::id());
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .expect("listing /dev/shm")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&mine))
            .collect();
        assert!(left.is_empty(), "regions left behind: {left:?}");
    }
}

#[test]
fn shm_peer_closes_with_messages_in_flight() {
    peer_closes_with_messages_in_flight("shm");
}

#[test]
fn tcp_peer_closes_with_messages_in_flight() {
    peer_closes_with_messages_in_flight("tcp;ofi_rxm");
}
