//! Persistent one-sided puts (`Communicator::put_init`) and gets
//! (`get_init`) between two ranks over shared memory, TCP and libfabric
//! (tcp and shm providers): one way and both ways, one write or read and
//! several a round, contents changing every round and checked byte for
//! byte; and the refusals (lengths that do not match, more than two ranks).
//! Every transport has one-sided writes and reads (TCP's emulated over the
//! stream), so the refusal of a put or get on a transport without them has
//! no case here.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, PersistentTransfer, TransportChoice};
use std::time::Duration;

fn world(
    n: u32,
    t: TransportChoice,
    provider: Option<&str>,
    key: &str,
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    let provider = provider.map(str::to_string);
    local_world(n, key, move |_, cfg| {
        cfg.transport.set(t);
        cfg.ofi_provider.set(provider.clone());
        cfg.timeout.set(Duration::from_secs(30));
    })
    .unwrap()
}

fn byte(src: u32, round: usize, i: usize) -> u8 {
    (src as usize * 77 + round * 13 + i * 7) as u8
}

/// Which one-sided transfer a test plans.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Put,
    Get,
}

/// Plans `kind` on `c`: for a put `src` is written into the peer's
/// `dst`; for a get the peer's `src` is read into this rank's `dst`.
fn plan<'a>(
    c: &'a Communicator,
    kind: Kind,
    src: &'a [u8],
    dst: &'a mut [u8],
    reps: usize,
) -> gw_collectives::Result<PersistentTransfer<'a>> {
    match kind {
        Kind::Put => c.put_init(src, dst, reps),
        Kind::Get => c.get_init(src, dst, reps),
    }
}

/// Both ranks run six plans of one round each; rank 0's bytes go to rank
/// 1, and rank 1's to rank 0 too when `bidir`; every round's bytes are
/// checked where they land.
fn rounds(comms: Vec<Communicator>, kind: Kind, len: usize, reps: usize, bidir: bool) {
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || -> Result<(), String> {
                let r = c.rank();
                let sends = r == 0 || bidir;
                let recvs = r == 1 || bidir;
                let mut send = vec![0u8; if sends { len } else { 0 }];
                let mut recv = vec![0u8; if recvs { len } else { 0 }];
                for k in 0..6 {
                    send.iter_mut()
                        .enumerate()
                        .for_each(|(i, b)| *b = byte(r, k, i));
                    let mut put =
                        plan(&c, kind, &send, &mut recv, reps).map_err(|e| e.to_string())?;
                    put.start().map_err(|e| e.to_string())?;
                    put.wait().map_err(|e| e.to_string())?;
                    drop(put);
                    if recvs && let Some(i) = (0..len).find(|&i| recv[i] != byte(1 - r, k, i)) {
                        return Err(format!(
                            "{kind:?} rank {r} round {k}: byte {i} is {}",
                            recv[i]
                        ));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
}

/// One plan, many rounds: the contents change between rounds. For a get
/// this is the protocol's test: a read that came before the owner's round
/// began, or the owner changing its bytes before the reader's reads
/// completed, shows as the wrong round's bytes.
fn many_rounds(comms: Vec<Communicator>, kind: Kind, len: usize) {
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank();
                let mut send = vec![0u8; len];
                let mut recv = vec![0u8; len];
                // The buffers are reached only between rounds, through
                // copies made while no round runs.
                let sp = send.as_mut_ptr();
                let rp = recv.as_ptr();
                let mut put = plan(&c, kind, &send, &mut recv, 3).unwrap();
                for k in 0..200 {
                    // SAFETY: no round is running; the plan only reads
                    // `send` and writes `recv` during one.
                    unsafe {
                        for i in 0..len {
                            *sp.add(i) = byte(r, k, i);
                        }
                    }
                    put.start().unwrap();
                    put.wait().unwrap();
                    for i in [0, len / 2, len - 1] {
                        // SAFETY: as above.
                        let got = unsafe { *rp.add(i) };
                        assert_eq!(
                            got,
                            byte(1 - r, k, i),
                            "{kind:?} rank {r} round {k} byte {i}"
                        );
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

const SETUPS: [(TransportChoice, Option<&str>, &str); 4] = [
    (TransportChoice::Shm, None, "shm"),
    (TransportChoice::Tcp, None, "tcp"),
    (TransportChoice::Ofi, Some("tcp;ofi_rxm"), "ofitcp"),
    (TransportChoice::Ofi, Some("shm"), "ofishm"),
];

#[test]
fn puts_land_one_way_and_both_ways() {
    for (t, p, name) in SETUPS {
        for (len, reps) in [(1, 1), (4099, 4), (3 << 20, 2)] {
            for bidir in [false, true] {
                let key = format!("put{name}{len}{reps}{bidir}");
                rounds(world(2, t, p, &key).1, Kind::Put, len, reps, bidir);
            }
        }
    }
}

#[test]
fn gets_fetch_one_way_and_both_ways() {
    for (t, p, name) in SETUPS {
        for (len, reps) in [(1, 1), (4099, 4), (3 << 20, 2)] {
            for bidir in [false, true] {
                let key = format!("get{name}{len}{reps}{bidir}");
                rounds(world(2, t, p, &key).1, Kind::Get, len, reps, bidir);
            }
        }
    }
}

#[test]
fn one_plan_runs_many_rounds() {
    for (t, p, name) in SETUPS {
        many_rounds(
            world(2, t, p, &format!("putmany{name}")).1,
            Kind::Put,
            70_001,
        );
    }
    for (t, p, name) in SETUPS {
        many_rounds(
            world(2, t, p, &format!("getmany{name}")).1,
            Kind::Get,
            70_001,
        );
    }
}

#[test]
fn puts_are_refused_with_reasons() {
    let (_s, comms) = world(2, TransportChoice::Shm, None, "putlens");
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank() as usize;
                let send = vec![1u8; if r == 0 { 100 } else { 0 }];
                let mut recv = vec![0u8; if r == 1 { 99 } else { 0 }];
                c.put_init(&send, &mut recv, 1).err().unwrap().to_string()
            })
        })
        .collect();
    for t in threads {
        let e = t.join().unwrap();
        // Named by the exchange's fingerprint check or by put_init's own.
        assert!(e.contains("100") && e.contains("99"), "{e}");
    }
    let (_s, comms) = world(3, TransportChoice::Shm, None, "put3");
    for c in comms {
        let mut recv = [0u8; 1];
        let e = c.put_init(&[], &mut recv, 1).err().unwrap().to_string();
        assert!(e.contains("exactly 2 ranks"), "{e}");
        let e = c.get_init(&[], &mut recv, 1).err().unwrap().to_string();
        assert!(
            e.contains("get_init needs") && e.contains("exactly 2 ranks"),
            "{e}"
        );
    }
}

#[test]
fn gets_are_refused_with_reasons() {
    // Lengths: rank 1 reads 99 bytes of rank 0's 100.
    let (_s, comms) = world(2, TransportChoice::Shm, None, "getlens");
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank() as usize;
                let expose = vec![1u8; if r == 0 { 100 } else { 0 }];
                let mut into = vec![0u8; if r == 1 { 99 } else { 0 }];
                c.get_init(&expose, &mut into, 1).err().unwrap().to_string()
            })
        })
        .collect();
    for t in threads {
        let e = t.join().unwrap();
        assert!(e.contains("100") && e.contains("99"), "{e}");
    }
    // A rank that lends bytes nobody reads would wait for a `Done` that
    // never comes: refused at init. Rank 0 lends 64 bytes and reads 64;
    // rank 1 lends 64 and reads none.
    let (_s, comms) = world(2, TransportChoice::Shm, None, "getnoreader");
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let expose = [1u8; 64];
                let mut into = vec![0u8; if c.rank() == 0 { 64 } else { 0 }];
                (
                    c.rank(),
                    c.get_init(&expose, &mut into, 1).err().unwrap().to_string(),
                )
            })
        })
        .collect();
    for t in threads {
        let (r, e) = t.join().unwrap();
        let want = if r == 0 {
            "rank 1 reads this rank's 64 bytes a round into its receive buffer of 0"
        } else {
            "rank 0 lends 64 bytes a round, read into this rank's receive buffer of 0"
        };
        assert!(e.contains(want), "rank {r}: {e}");
    }
}
