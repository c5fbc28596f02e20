//! One-sided writes over shared memory (`write_imm` / `next_imm`): bytes
//! stored straight into a published region, immediates through the ring.

use super::tests::{drive_sleeping, infos, job, pair, pattern, reg, run, spawn_child, tag};
use super::*;
use crate::seam::Outstanding;
use std::time::{Duration, Instant};

/// Progresses both sides until `b` has an immediate from rank 0 (at most 2 s).
fn next_imm(a: &mut ShmTransport, b: &mut ShmTransport) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        a.progress().unwrap();
        b.progress().unwrap();
        if let Some(v) = b.next_imm().unwrap() {
            assert_eq!(v.from, Some(0), "shared memory knows the writer");
            return v.imm;
        }
        assert!(Instant::now() < deadline, "no immediate arrived");
    }
}

fn write(
    a: &mut ShmTransport,
    mem: MemHandle,
    offset: usize,
    len: usize,
    remote: RemoteRegion,
    remote_offset: u64,
    imm: u32,
) -> Outstanding {
    let w = WriteImm {
        mem,
        offset,
        len,
        remote,
        remote_offset,
        imm,
    };
    Outstanding::new(a.write_imm(1, &w).unwrap())
}

#[test]
fn writes_land_in_the_published_region_before_their_immediate() {
    let (mut a, mut b) = pair("os-sizes", 4, 4096);
    assert!(a.properties().one_sided_write);
    let big = (1 << 20) + 7;
    let mut src = pattern(big, 5);
    let mut dst = vec![0u8; big + 100];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let region = b.remote_region(md).unwrap().unwrap();
    assert_eq!((region.rank, region.len), (1, (big + 100) as u64));
    for (i, &(off, len, at)) in [(0, 1, 0), (3, 4096, 17), (0, big, 100), (9, 0, 5)]
        .iter()
        .enumerate()
    {
        let w = write(&mut a, ms, off, len, region, at, 0x1234_0000 + i as u32);
        run(&mut a, &mut b, vec![w], Vec::<Outstanding>::new());
        assert_eq!(next_imm(&mut a, &mut b), 0x1234_0000 + i as u32);
        let at = at as usize;
        assert!(
            dst[at..at + len] == src[off..off + len],
            "write {i} landed wrong"
        );
    }
    assert_eq!(b.next_imm().unwrap(), None);
}

#[test]
fn many_writes_keep_their_immediates_in_order_through_a_small_ring() {
    let (mut a, mut b) = pair("os-many", 2, 256);
    let mut src = pattern(64 * 100, 9);
    let mut dst = vec![0u8; 64 * 100];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let region = b.remote_region(md).unwrap().unwrap();
    let ws: Vec<Outstanding> = (0..100)
        .map(|k| write(&mut a, ms, k * 64, 64, region, (k * 64) as u64, k as u32))
        .collect();
    run(&mut a, &mut b, ws, Vec::<Outstanding>::new());
    for k in 0..100 {
        assert_eq!(next_imm(&mut a, &mut b), k);
    }
    assert_eq!(dst, src);
}

#[test]
fn an_immediate_behind_data_nobody_asked_for_still_arrives() {
    // The ring's head is a message whose receive is not posted; the
    // immediate behind it must not wait for that receive.
    let (mut a, mut b) = pair("os-behind", 4, 4096);
    let mut msg = pattern(100, 1);
    let mut got = vec![0u8; 100];
    let mut cell = [0u8; 8];
    let ms = reg(&mut a, &mut msg);
    let mg = reg(&mut b, &mut got);
    let mc = reg(&mut b, &mut cell);
    let region = b.remote_region(mc).unwrap().unwrap();
    let s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 100).unwrap());
    run(&mut a, &mut b, vec![s], Vec::<Outstanding>::new());
    let w = write(&mut a, ms, 0, 8, region, 0, 77);
    run(&mut a, &mut b, vec![w], Vec::<Outstanding>::new());
    assert_eq!(next_imm(&mut a, &mut b), 77);
    assert_eq!(cell[..], msg[..8]);
    let r = Outstanding::new(b.irecv(0, tag(1, 0), mg, 0, 100).unwrap());
    run(&mut a, &mut b, Vec::<Outstanding>::new(), vec![r]);
    assert_eq!(got, msg);
}

#[test]
fn bad_descriptors_and_ranges_are_refused_before_any_byte_moves() {
    let (mut a, mut b) = pair("os-bad", 4, 4096);
    let mut src = pattern(64, 2);
    let mut dst = vec![0u8; 32];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let region = b.remote_region(md).unwrap().unwrap();
    let try_write = |a: &mut ShmTransport, r: RemoteRegion, len: usize, at: u64| {
        let w = WriteImm {
            mem: ms,
            offset: 0,
            len,
            remote: r,
            remote_offset: at,
            imm: 1,
        };
        a.write_imm(1, &w).unwrap_err().to_string()
    };
    let e = try_write(&mut a, region, 33, 0);
    assert!(
        e.contains("outside its published region of 32 bytes"),
        "{e}"
    );
    let e = try_write(&mut a, region, 8, 30);
    assert!(e.contains("outside"), "{e}");
    let e = try_write(&mut a, RemoteRegion { rank: 0, ..region }, 8, 0);
    assert!(e.contains("rank 0 published"), "{e}");
    let e = try_write(
        &mut a,
        RemoteRegion {
            key: region.key ^ (1 << 40),
            ..region
        },
        8,
        0,
    );
    assert!(e.contains("stale or foreign"), "{e}");
    let w = WriteImm {
        mem: ms,
        offset: 60,
        len: 8,
        remote: region,
        remote_offset: 0,
        imm: 1,
    };
    let e = a.write_imm(1, &w).unwrap_err().to_string();
    assert!(e.contains("outside registered region"), "{e}");
    assert!(dst.iter().all(|&x| x == 0), "a refused write moved bytes");
    assert!(b.remote_region(MemHandle::new(b.id, 9)).is_err());
}

/// A region descriptor as the tests send it to the other process.
fn encode(r: &RemoteRegion) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, v) in [u64::from(r.rank), r.key, r.addr, r.len].iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

fn decode(b: &[u8; 32]) -> RemoteRegion {
    let at = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    RemoteRegion {
        rank: at(0) as u32,
        key: at(1),
        addr: at(2),
        len: at(3),
    }
}

/// Rank 1 in a child process (mode "write" of `tests::child_rank`): takes
/// rank 0's region descriptor, writes `len` bytes into it one-sidedly, and
/// leaves once rank 0 acknowledges.
pub(super) fn child_writes(t: &mut ShmTransport, poll: &mut mio::Poll, len: usize) {
    let mut desc = [0u8; 32];
    let md = reg(t, &mut desc);
    let r = Outstanding::new(t.irecv(0, tag(1, 0), md, 0, 32).unwrap());
    drive_sleeping(t, poll, vec![r]);
    let region = decode(&desc);
    let mut src = pattern(len, 33);
    let ms = reg(t, &mut src);
    let w = WriteImm {
        mem: ms,
        offset: 0,
        len,
        remote: RemoteRegion { rank: 0, ..region },
        remote_offset: 0,
        imm: 0xfeed,
    };
    let w = Outstanding::new(t.write_imm(0, &w).unwrap());
    let ack = Outstanding::new(t.irecv(0, tag(1, 1), md, 0, 0).unwrap());
    drive_sleeping(t, poll, vec![w, ack]);
}

#[test]
fn two_processes_write_one_sidedly() {
    let j = job("os-proc");
    let len = (4 << 20) + 3;
    let mut child = spawn_child(&j, "write", len);
    let mut ps = infos(2);
    ps[1].pid = child.id();
    let mut t = ShmTransport::new(0, ps, super::tests::cfg(&j, 4, 64 << 10)).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    t.attach(poll.registry(), 0).unwrap();
    assert_eq!(t.connect(1).unwrap(), Readiness::Ready);
    let mut dst = vec![0u8; len];
    let md = reg(&mut t, &mut dst);
    let mut desc = encode(&t.remote_region(md).unwrap().unwrap());
    let mdesc = reg(&mut t, &mut desc);
    let s = Outstanding::new(t.isend(1, tag(1, 0), mdesc, 0, 32).unwrap());
    drive_sleeping(&mut t, &mut poll, vec![s]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let imm = loop {
        t.progress().unwrap();
        if let Some(v) = t.next_imm().unwrap() {
            assert_eq!(v.from, Some(1));
            break v.imm;
        }
        assert!(Instant::now() < deadline, "the child's write never arrived");
        std::thread::sleep(Duration::from_micros(50));
    };
    assert_eq!(imm, 0xfeed);
    assert!(dst == pattern(len, 33), "the child's bytes landed wrong");
    let ack = Outstanding::new(t.isend(1, tag(1, 1), mdesc, 0, 0).unwrap());
    drive_sleeping(&mut t, &mut poll, vec![ack]);
    assert!(child.wait().unwrap().success());
}

/// A page-aligned anonymous mapping the test can make unwritable without
/// giving its addresses back (another thread could map them again).
struct Pages {
    ptr: *mut u8,
    len: usize,
}

impl Pages {
    fn new(len: usize) -> Pages {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap");
        Pages {
            ptr: ptr.cast(),
            len,
        }
    }

    /// What a peer sees once the owner freed the buffer: writes fault.
    fn withdraw(&self) {
        // SAFETY: our own mapping; nothing in this process uses it after.
        let rc = unsafe { libc::mprotect(self.ptr.cast(), self.len, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect");
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Writes 64 bytes from `a` into `region` (rank 1's), returning the error.
fn failed_write(a: &mut ShmTransport, region: RemoteRegion) -> Error {
    let mut src = pattern(64, 4);
    let ms = reg(a, &mut src);
    let w = WriteImm {
        mem: ms,
        offset: 0,
        len: 64,
        remote: region,
        remote_offset: 0,
        imm: 1,
    };
    let e = a.write_imm(1, &w).unwrap_err();
    a.deregister(ms).unwrap();
    e
}

#[test]
fn a_write_into_a_withdrawn_region_reports_why_its_owner_withdrew_it() {
    // The owner (rank 1) failed because of a third rank, said so in an
    // Abort frame, and freed its buffer; the writer must report that
    // reason, which names the rank at fault, not its own page fault.
    let (mut a, mut b) = pair("os-withdrawn", 4, 4096);
    let pages = Pages::new(1 << 16);
    // SAFETY: `pages` outlives both transports' use of it.
    let md = unsafe { b.register(pages.ptr, pages.len) }.unwrap();
    let region = b.remote_region(md).unwrap().unwrap();
    b.abort("rank 1 failed: rank 7 (elsewhere): process 4242 died");
    pages.withdraw();
    match failed_write(&mut a, region) {
        Error::Remote { rank, what, .. } => {
            assert_eq!(rank, 1);
            assert!(
                what.contains("aborted: rank 1 failed: rank 7"),
                "the owner's reason is lost: {what}"
            );
        }
        other => panic!("expected the owner's abort, got {other}"),
    }
}

#[test]
fn a_write_into_a_withdrawn_region_without_a_reason_names_the_fault() {
    let (mut a, mut b) = pair("os-withdrawn-mute", 4, 4096);
    let pages = Pages::new(1 << 16);
    // SAFETY: `pages` outlives both transports' use of it.
    let md = unsafe { b.register(pages.ptr, pages.len) }.unwrap();
    let region = b.remote_region(md).unwrap().unwrap();
    pages.withdraw();
    let e = failed_write(&mut a, region);
    assert!(matches!(e, Error::Sys { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("process_vm_writev") && text.contains("not mapped"),
        "{text}"
    );
}
