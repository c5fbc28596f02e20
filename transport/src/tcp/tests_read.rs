//! One-sided reads over TCP (`Transport::read`): a `Get` frame that the
//! region's owner answers from its own progress with a `Fetched` frame.
//! Bytes land where the reader asked; many reads in flight both ways at
//! once, of random sizes, each get their own bytes; bad reads are refused
//! by the reader before anything is sent, and a stale descriptor by the
//! owner, naming the reader.

use super::tests::{LIMIT, pair, pair_with, pattern, tag, until};
use super::*;
use crate::seam::Outstanding;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Registers `v` with `t`.
fn reg(t: &mut TcpTransport, v: &mut [u8]) -> MemHandle {
    // SAFETY: every vector registered here outlives the transports' use.
    unsafe { t.register(v.as_mut_ptr(), v.len()) }.unwrap()
}

fn read_from(
    mem: MemHandle,
    offset: usize,
    len: usize,
    remote: RemoteRegion,
    remote_offset: u64,
) -> ReadFrom {
    ReadFrom {
        mem,
        offset,
        len,
        remote,
        remote_offset,
    }
}

#[test]
fn reads_fetch_the_published_bytes() {
    let (mut a, mut b) = pair(3);
    assert!(a.properties().one_sided_read);
    let big = (3 << 20) + 7;
    let mut src = pattern(big + 100, 5);
    let mut dst = vec![0u8; big + 50];
    let ms = reg(&mut b, &mut src);
    let md = reg(&mut a, &mut dst);
    let region = b.remote_region(ms).unwrap().unwrap();
    for (i, &(off, len, at)) in [(0, 1, 0), (3, 4096, 17), (50, big, 100), (9, 0, 5)]
        .iter()
        .enumerate()
    {
        let req = a.read(1, &read_from(md, off, len, region, at)).unwrap();
        let mut r = Outstanding::new(req);
        until(&mut a, &mut b, "the read", |a, _| r.poll(a).unwrap());
        let at = at as usize;
        assert!(
            dst[off..off + len] == src[at..at + len],
            "read {i} fetched wrong bytes"
        );
    }
    // A read is not a write: the owner saw no immediate.
    assert_eq!(b.next_imm().unwrap(), None);
}

/// Both ranks read from each other at once, 300 reads of random extents in
/// flight together over three lanes; every one gets exactly its bytes.
#[test]
fn many_reads_both_ways_each_get_their_own_bytes() {
    let (mut a, mut b) = pair(3);
    let n = 1 << 20;
    let mut src_a = pattern(n, 1);
    let mut src_b = pattern(n, 2);
    let mut dst_a = vec![0u8; n];
    let mut dst_b = vec![0u8; n];
    let (sa, da) = (reg(&mut a, &mut src_a), reg(&mut a, &mut dst_a));
    let (sb, db) = (reg(&mut b, &mut src_b), reg(&mut b, &mut dst_b));
    let (ra, rb) = (
        a.remote_region(sa).unwrap().unwrap(),
        b.remote_region(sb).unwrap().unwrap(),
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // Disjoint destinations so that every read's bytes can be checked.
    let mut jobs = Vec::new();
    let mut at = 0usize;
    while jobs.len() < 300 {
        let len = rng.random_range(0..7000);
        if at + len > n {
            break;
        }
        let from = rng.random_range(0..=n - len) as u64;
        let by_a = rng.random_bool(0.5);
        jobs.push((by_a, at, len, from));
        at += len;
    }
    let mut reqs: Vec<(bool, Outstanding)> = jobs
        .iter()
        .map(|&(by_a, at, len, from)| {
            let req = if by_a {
                a.read(1, &read_from(da, at, len, rb, from)).unwrap()
            } else {
                b.read(0, &read_from(db, at, len, ra, from)).unwrap()
            };
            (by_a, Outstanding::new(req))
        })
        .collect();
    until(&mut a, &mut b, "300 reads", |a, b| {
        reqs.retain_mut(|(by_a, r)| {
            let t: &mut TcpTransport = if *by_a { &mut *a } else { &mut *b };
            !r.poll(t).unwrap()
        });
        reqs.is_empty()
    });
    for &(by_a, at, len, from) in &jobs {
        let from = from as usize;
        let (dst, src) = if by_a {
            (&dst_a, &src_b)
        } else {
            (&dst_b, &src_a)
        };
        assert!(
            dst[at..at + len] == src[from..from + len],
            "the read of [{from}, +{len}) by rank {} got other bytes",
            u8::from(!by_a)
        );
    }
}

#[test]
fn bad_reads_are_refused_before_anything_is_sent() {
    let (mut a, mut b) = pair(1);
    let mut src = pattern(32, 2);
    let mut dst = vec![0u8; 64];
    let ms = reg(&mut b, &mut src);
    let md = reg(&mut a, &mut dst);
    let region = b.remote_region(ms).unwrap().unwrap();
    let mut e = |r: ReadFrom| a.read(1, &r).unwrap_err().to_string();
    let t = e(read_from(md, 0, 33, region, 0));
    assert!(
        t.contains("read from rank 1") && t.contains("outside its published region of 32 bytes"),
        "{t}"
    );
    assert!(e(read_from(md, 0, 8, region, 30)).contains("outside"));
    let t = e(read_from(md, 60, 8, region, 0));
    assert!(t.contains("exceeds the 64-byte registered region"), "{t}");
    let t = e(read_from(md, 0, 8, RemoteRegion { rank: 0, ..region }, 0));
    assert!(t.contains("rank 0 published"), "{t}");
    let foreign = RemoteRegion {
        key: 1 << 40,
        ..region
    };
    assert!(e(read_from(md, 0, 8, foreign, 0)).contains("not a TCP region's"));
    let huge = RemoteRegion {
        len: u64::MAX,
        ..region
    };
    let mut big = vec![0u8; 1];
    let mb = reg(&mut a, &mut big);
    // The length is checked against the reader's registration first, so a
    // 4 GiB read needs a 4 GiB registration; the limit itself is below.
    assert!(a.read(1, &read_from(mb, 0, 2, huge, 0)).is_err());
    assert_eq!(a.reads.len(), 0, "a refused read left nothing pending");
    assert!(a.conns[&1].only_control_queued());
}

#[test]
fn a_read_through_a_stale_descriptor_is_refused_by_the_owner() {
    let (mut a, mut b) = pair(1);
    let mut src = pattern(4096, 3);
    let mut dst = vec![0u8; 4096];
    let ms = reg(&mut b, &mut src);
    let md = reg(&mut a, &mut dst);
    let region = b.remote_region(ms).unwrap().unwrap();
    // The slot goes and comes back: the old descriptor names nothing now.
    b.deregister(ms).unwrap();
    let ms2 = reg(&mut b, &mut src);
    assert_ne!(b.remote_region(ms2).unwrap().unwrap().key, region.key);
    let mut r = Outstanding::new(a.read(1, &read_from(md, 0, 64, region, 0)).unwrap());
    let start = Instant::now();
    let e = loop {
        assert!(!r.poll(&mut a).unwrap(), "a refused read completed");
        a.progress().unwrap();
        if let Err(e) = b.progress() {
            break e.to_string();
        }
        assert!(start.elapsed() < LIMIT, "the stale read was not refused");
    };
    assert!(
        e.contains("read one-sidedly from region") && e.contains("stale descriptor"),
        "{e}"
    );
    assert!(e.contains("rank 0"), "{e}");
}

/// Credits owed to a peer ride on whatever frame goes to it next (see
/// `send_lane`), one-sided frames included: a `Put`, a `Get` and a
/// `Fetched` must each hand them back, or the peer would have to announce
/// every eager message from then on.
#[test]
fn one_sided_frames_return_the_credits_they_carry() {
    // Without small buffers: the 8-byte messages below take frame credits,
    // the ones that ride on other frames (small credits ride only on
    // `Credit` frames).
    let (mut a, mut b) = pair_with(TcpConfig {
        lanes: 1,
        small_frames: 0,
        ..TcpConfig::default()
    });
    let cap = b.conns[&0].credits.available();
    let mut buf_b = pattern(4096, 4);
    let mut buf_a = vec![0u8; 4096];
    let mb = reg(&mut b, &mut buf_b);
    let ma = reg(&mut a, &mut buf_a);
    let region_b = b.remote_region(mb).unwrap().unwrap();
    let region_a = a.remote_region(ma).unwrap().unwrap();
    // b -> a eager messages: a owes b their credits (fewer than half of
    // them, so no `Credit` frame of its own takes them).
    let owe = |a: &mut TcpTransport, b: &mut TcpTransport, n: u32| {
        for step in 0..n {
            let mut s = Outstanding::new(b.isend(0, tag(step), mb, 0, 8).unwrap());
            let mut r = Outstanding::new(a.irecv(1, tag(step), ma, 0, 8).unwrap());
            let mut sent = false;
            until(a, b, "an eager message", |a, b| {
                sent = sent || s.poll(b).unwrap();
                sent && r.poll(a).unwrap()
            });
        }
    };
    let n = (cap as u32 / 2).saturating_sub(1).max(1);
    owe(&mut a, &mut b, n);
    assert_eq!(b.conns[&0].credits.available(), cap - n as usize);
    // A one-sided write from a carries them back.
    let w = WriteImm {
        mem: ma,
        offset: 0,
        len: 16,
        remote: region_b,
        remote_offset: 0,
        imm: 7,
    };
    let mut r = Outstanding::new(a.write_imm(1, &w).unwrap());
    until(&mut a, &mut b, "the write", |a, b| {
        r.poll(a).unwrap() && b.next_imm().unwrap().is_some()
    });
    until(&mut a, &mut b, "the credits", |_, b| {
        b.conns[&0].credits.available() == cap
    });
    // So does a read's request frame.
    owe(&mut a, &mut b, n);
    let mut r = Outstanding::new(a.read(1, &read_from(ma, 0, 16, region_b, 0)).unwrap());
    until(&mut a, &mut b, "the read", |a, _| r.poll(a).unwrap());
    until(&mut a, &mut b, "the credits", |_, b| {
        b.conns[&0].credits.available() == cap
    });
    // And the answer to a read, going the other way: b reads from a while
    // b owes a.
    let cap_a = a.conns[&1].credits.available();
    for step in 0..n {
        let mut s = Outstanding::new(a.isend(1, tag(100 + step), ma, 0, 8).unwrap());
        let mut rr = Outstanding::new(b.irecv(0, tag(100 + step), mb, 0, 8).unwrap());
        let mut sent = false;
        until(&mut a, &mut b, "an eager message", |a, b| {
            sent = sent || s.poll(a).unwrap();
            sent && rr.poll(b).unwrap()
        });
    }
    assert_eq!(a.conns[&1].credits.available(), cap_a - n as usize);
    let mut r = Outstanding::new(b.read(0, &read_from(mb, 0, 16, region_a, 0)).unwrap());
    until(&mut a, &mut b, "the read", |_, b| r.poll(b).unwrap());
    until(&mut a, &mut b, "the credits", |a, _| {
        a.conns[&1].credits.available() == cap_a
    });
}
