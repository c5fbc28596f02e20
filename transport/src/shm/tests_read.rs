//! One-sided reads over shared memory (`Transport::read`): bytes fetched
//! straight from a published region with `process_vm_readv`, the owner
//! taking no part.

use super::tests::{pair, pattern, reg};
use super::*;

fn read(
    a: &mut ShmTransport,
    mem: MemHandle,
    offset: usize,
    len: usize,
    remote: RemoteRegion,
    remote_offset: u64,
) -> Result<Request> {
    let r = ReadFrom {
        mem,
        offset,
        len,
        remote,
        remote_offset,
    };
    a.read(1, &r)
}

#[test]
fn reads_fetch_the_published_bytes_without_the_owner_progressing() {
    let (mut a, mut b) = pair("rd-sizes", 4, 4096);
    assert!(a.properties().one_sided_read);
    let big = (1 << 20) + 7;
    let mut src = pattern(big + 100, 5);
    let mut dst = vec![0u8; big + 50];
    let ms = reg(&mut b, &mut src);
    let md = reg(&mut a, &mut dst);
    let region = b.remote_region(ms).unwrap().unwrap();
    // `b` is never progressed: a read needs nothing from its owner.
    for (i, &(off, len, at)) in [(0, 1, 0), (3, 4096, 17), (50, big, 100), (9, 0, 5)]
        .iter()
        .enumerate()
    {
        let req = read(&mut a, md, off, len, region, at).unwrap();
        assert_eq!(a.test(req).unwrap(), Tested::Done, "read {i} pending");
        let at = at as usize;
        assert!(
            dst[off..off + len] == src[at..at + len],
            "read {i} fetched wrong bytes"
        );
    }
    // Nothing reached the owner: no immediate, no frame.
    assert_eq!(b.next_imm().unwrap(), None);
}

#[test]
fn bad_reads_are_refused_before_any_byte_moves() {
    let (mut a, mut b) = pair("rd-bad", 4, 4096);
    let mut src = pattern(32, 2);
    let mut dst = vec![0u8; 64];
    let ms = reg(&mut b, &mut src);
    let md = reg(&mut a, &mut dst);
    let region = b.remote_region(ms).unwrap().unwrap();
    let e = |r: Result<Request>| r.unwrap_err().to_string();
    let t = e(read(&mut a, md, 0, 33, region, 0));
    assert!(
        t.contains("read of rank 1") && t.contains("outside its published region of 32 bytes"),
        "{t}"
    );
    let t = e(read(&mut a, md, 0, 8, region, 30));
    assert!(t.contains("outside"), "{t}");
    let t = e(read(
        &mut a,
        md,
        0,
        8,
        RemoteRegion { rank: 0, ..region },
        0,
    ));
    assert!(t.contains("rank 0 published"), "{t}");
    let foreign = RemoteRegion {
        key: region.key ^ (1 << 40),
        ..region
    };
    let t = e(read(&mut a, md, 0, 8, foreign, 0));
    assert!(t.contains("stale or foreign"), "{t}");
    let t = e(read(&mut a, md, 60, 8, region, 0));
    assert!(t.contains("outside registered region"), "{t}");
    assert!(dst.iter().all(|&x| x == 0), "a refused read moved bytes");
}

#[test]
fn a_read_from_a_withdrawn_region_reports_why_its_owner_withdrew_it() {
    let (mut a, mut b) = pair("rd-withdrawn", 4, 4096);
    let mut src = pattern(1 << 16, 3);
    let ms = reg(&mut b, &mut src);
    let region = b.remote_region(ms).unwrap().unwrap();
    b.abort("rank 1 failed: rank 7 (elsewhere): process 4242 died");
    let mut dst = vec![0u8; 64];
    let md = reg(&mut a, &mut dst);
    // An address the owner never mapped: what a freed buffer looks like.
    let gone = RemoteRegion { addr: 8, ..region };
    match read(&mut a, md, 0, 64, gone, 0).unwrap_err() {
        Error::Remote { rank, what, .. } => {
            assert_eq!(rank, 1);
            assert!(
                what.contains("rank 7"),
                "the owner's reason is lost: {what}"
            );
        }
        other => panic!("expected the owner's abort, got {other}"),
    }
}

#[test]
fn a_read_from_an_unmapped_address_names_the_syscall_and_the_fault() {
    let (mut a, mut b) = pair("rd-unmapped", 4, 4096);
    let mut src = pattern(64, 3);
    let ms = reg(&mut b, &mut src);
    let region = b.remote_region(ms).unwrap().unwrap();
    let mut dst = vec![0u8; 64];
    let md = reg(&mut a, &mut dst);
    let gone = RemoteRegion { addr: 8, ..region };
    let e = read(&mut a, md, 0, 64, gone, 0).unwrap_err();
    assert!(matches!(e, Error::Sys { .. }), "{e}");
    let t = e.to_string();
    assert!(
        t.contains("process_vm_readv") && t.contains("not mapped"),
        "{t}"
    );
}
