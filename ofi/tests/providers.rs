//! Real libfabric, no mocks: two endpoints in one process on each of the
//! providers that need no hardware (`tcp;ofi_rxm`, `shm`), moving bytes
//! with sends, one-sided writes with immediate data, and reads; and the
//! provider choice and its errors.

mod common;

use common::*;
use gw_ofi::*;
use std::collections::BTreeSet;

macro_rules! provider_tests {
    ($module:ident, $prov:expr) => {
        mod $module {
            #[test]
            fn send_recv_and_inject() {
                super::send_recv_and_inject($prov);
            }
            #[test]
            fn writedata_1b_4k_8m() {
                super::writedata_sizes($prov);
            }
            #[test]
            fn many_writes_in_flight() {
                super::many_writes_in_flight($prov, 64);
            }
            #[test]
            fn read() {
                super::read($prov);
            }
            #[test]
            fn wait_fd_and_trywait() {
                super::wait_fd_and_trywait($prov);
            }
            #[test]
            fn registration_cache() {
                super::registration_cache($prov);
            }
            #[test]
            fn failed_operations_come_back_with_their_context() {
                super::failed_operations($prov);
            }
        }
    };
}

provider_tests!(tcp, "tcp;ofi_rxm");
provider_tests!(shm, "shm");

fn send_recv_and_inject(prov: &str) {
    let Some((mut a, mut b, a_to_b, _)) = pair(prov) else {
        return;
    };
    const LEN: usize = 64 << 10;
    let mut src = Buf::new(LEN);
    let r1 = Buf::new(LEN);
    let r2 = Buf::new(LEN);
    let want = pattern(LEN, 1);
    src.bytes_mut().copy_from_slice(&want);
    // SAFETY: the buffers outlive their registrations (dropped first, in
    // reverse order of declaration) and every transfer is waited for.
    let smr = unsafe { a.ep.register(src.ptr(), LEN, FI_SEND) }.expect("register");
    // SAFETY: as above.
    let rmr1 = unsafe { b.ep.register(r1.ptr(), LEN, FI_RECV) }.expect("register");
    // SAFETY: as above.
    let rmr2 = unsafe { b.ep.register(r2.ptr(), LEN, FI_RECV) }.expect("register");
    // SAFETY: r1 and r2 are not touched until their completions are read.
    unsafe {
        b.ep.recv(r1.ptr(), LEN, rmr1.desc(), 11).expect("recv");
        b.ep.recv(r2.ptr(), LEN, rmr2.desc(), 12).expect("recv");
    }
    let small = *b"sixteen bytes!!!";
    post_retry(&mut [&mut a, &mut b], "fi_send", |s| {
        // SAFETY: src is not modified until the send's completion is read.
        unsafe { s[0].ep.send(src.ptr(), LEN, smr.desc(), a_to_b, 21) }
    });
    post_retry(&mut [&mut a, &mut b], "fi_inject", |s| {
        s[0].ep.inject(&small, a_to_b)
    });
    drive(&mut [&mut a, &mut b], "send and inject", |s| {
        has_ctx(s[0], 21) && has_ctx(s[1], 11) && has_ctx(s[1], 12)
    });
    let sent = take_ctx(&mut a, 21);
    assert!(
        sent[0].flags & FI_SEND != 0,
        "{prov}: send completion flags {:#x}",
        sent[0].flags
    );
    assert_eq!(a.ep.in_flight(), 0);
    assert_eq!(b.ep.in_flight(), 0);
    let mut got = [take_ctx(&mut b, 11)[0], take_ctx(&mut b, 12)[0]];
    got.iter()
        .for_each(|c| assert!(c.flags & FI_RECV != 0, "{prov}: recv flags {:#x}", c.flags));
    let bufs = [&r1, &r2];
    // Matching order is the posting order where the provider orders
    // sends (FI_ORDER_SAS); tell them apart by length anyway.
    if got[0].len != LEN {
        got.swap(0, 1);
    }
    let (big, little) = if got[0].ctx == Some(11) {
        (bufs[0], bufs[1])
    } else {
        (bufs[1], bufs[0])
    };
    assert_eq!(got[0].len, LEN, "{prov}: {got:?}");
    assert_eq!(got[1].len, small.len(), "{prov}: {got:?}");
    assert!(big.bytes() == &want[..], "{prov}: received bytes differ");
    assert_eq!(&little.bytes()[..small.len()], &small);
}

fn writedata_sizes(prov: &str) {
    let Some((mut a, mut b, a_to_b, _)) = pair(prov) else {
        return;
    };
    const MAX: usize = 8 << 20;
    const OFF: usize = 4096;
    let mut src = Buf::new(MAX);
    let mut dst = Buf::new(MAX + 2 * OFF);
    // SAFETY: the buffers outlive their registrations and every transfer
    // is waited for before they are read or dropped.
    let smr = unsafe { a.ep.register(src.ptr(), src.len(), FI_WRITE) }.expect("register source");
    // SAFETY: as above.
    let dmr =
        unsafe { b.ep.register(dst.ptr(), dst.len(), FI_REMOTE_WRITE) }.expect("register target");
    assert!(
        a.ep.info().max_msg_size >= MAX,
        "{prov}: max_msg_size {}",
        a.ep.info().max_msg_size
    );
    for (i, (size, off)) in [(1usize, 7usize), (4096, OFF), (MAX, OFF)]
        .into_iter()
        .enumerate()
    {
        let i = i as u64;
        let want = pattern(size, 100 + i);
        src.bytes_mut()[..size].copy_from_slice(&want);
        dst.bytes_mut().fill(0);
        post_cq_data_receives(&mut b, 1, 1000 + i);
        let imm = 0x5eed_0000 + i;
        // SAFETY: dst + off lies inside dst.
        let at = unsafe { dst.ptr().add(off) };
        let remote = Remote {
            dest: a_to_b,
            addr: dmr.remote_addr(at).expect("inside"),
            key: dmr.key(),
        };
        if dmr.remote_addr(dst.ptr()) == Some(dst.ptr() as u64) {
            assert!(b.ep.info().mr(FI_MR_VIRT_ADDR));
        } else {
            assert_eq!(
                remote.addr, off as u64,
                "{prov}: offsets without FI_MR_VIRT_ADDR"
            );
        }
        post_retry(&mut [&mut a, &mut b], "fi_writedata", |s| {
            // SAFETY: src is not modified until the completion is read.
            unsafe {
                s[0].ep
                    .writedata(src.ptr(), size, smr.desc(), imm, remote, 500 + i)
            }
        });
        drive(
            &mut [&mut a, &mut b],
            &format!("writedata of {size} bytes"),
            |s| has_ctx(s[0], 500 + i) && has_imm(s[1], imm),
        );
        let done = take_ctx(&mut a, 500 + i);
        assert!(
            done[0].flags & FI_WRITE != 0,
            "{prov}: write flags {:#x}",
            done[0].flags
        );
        let arrived: Vec<Completion> = b.seen.drain(..).collect();
        let c = arrived
            .iter()
            .find(|c| c.data == imm)
            .expect("the immediate");
        assert!(c.flags & FI_REMOTE_CQ_DATA != 0, "{prov}: {c:x?}");
        if b.ep.info().mode & FI_RX_CQ_DATA != 0 {
            assert_eq!(c.ctx, Some(1000 + i), "{prov}: a posted receive carries it");
        }
        let got = &dst.bytes()[off..off + size];
        assert!(got == &want[..], "{prov}: {size} bytes written differ");
        assert!(
            dst.bytes()[..off].iter().all(|&x| x == 0),
            "{prov}: bytes before the target written"
        );
        assert!(
            dst.bytes()[off + size..].iter().all(|&x| x == 0),
            "{prov}: bytes after the target written"
        );
    }
    assert_eq!(a.ep.in_flight(), 0);
}

fn many_writes_in_flight(prov: &str, n: usize) {
    let Some((mut a, mut b, a_to_b, _)) = pair(prov) else {
        return;
    };
    const EACH: usize = 4096;
    let mut src = Buf::new(n * EACH);
    let dst = Buf::new(n * EACH);
    for (i, chunk) in src.bytes_mut().chunks_mut(EACH).enumerate() {
        chunk.copy_from_slice(&pattern(EACH, 7000 + i as u64));
    }
    // SAFETY: the buffers outlive their registrations; every transfer is
    // waited for.
    let smr = unsafe { a.ep.register(src.ptr(), src.len(), FI_WRITE) }.expect("register");
    // SAFETY: as above.
    let dmr = unsafe { b.ep.register(dst.ptr(), dst.len(), FI_REMOTE_WRITE) }.expect("register");
    post_cq_data_receives(&mut b, n as u64, 10_000);
    for i in 0..n {
        // SAFETY: both offsets lie inside their buffers.
        let (from, to) = unsafe { (src.ptr().add(i * EACH), dst.ptr().add(i * EACH)) };
        let remote = Remote {
            dest: a_to_b,
            addr: dmr.remote_addr(to).expect("inside"),
            key: dmr.key(),
        };
        post_retry(&mut [&mut a, &mut b], "fi_writedata", |s| {
            // SAFETY: src is not modified until all completions are read.
            unsafe {
                s[0].ep
                    .writedata(from, EACH, smr.desc(), 0xa000 + i as u64, remote, i as u64)
            }
        });
    }
    drive(&mut [&mut a, &mut b], &format!("{n} writes"), |s| {
        let mine = s[0].seen.iter().filter(|c| c.flags & FI_WRITE != 0).count();
        let theirs = s[1]
            .seen
            .iter()
            .filter(|c| c.flags & FI_REMOTE_CQ_DATA != 0)
            .count();
        mine == n && theirs == n
    });
    let ctxs: BTreeSet<u64> = a.seen.iter().filter_map(|c| c.ctx).collect();
    assert_eq!(ctxs, (0..n as u64).collect(), "{prov}: write contexts");
    let imms: BTreeSet<u64> = b.seen.iter().map(|c| c.data).collect();
    assert_eq!(
        imms,
        (0..n as u64).map(|i| 0xa000 + i).collect(),
        "{prov}: immediates"
    );
    assert!(dst.bytes() == src.bytes(), "{prov}: written bytes differ");
    assert_eq!((a.ep.in_flight(), b.ep.in_flight()), (0, 0));
}

fn read(prov: &str) {
    let Some((mut a, mut b, a_to_b, _)) = pair(prov) else {
        return;
    };
    if a.ep.info().caps & FI_READ == 0 {
        println!("skipped read on {prov}: no FI_READ");
        return;
    }
    const LEN: usize = 256 << 10;
    let local = Buf::new(LEN);
    let mut remote_buf = Buf::new(LEN);
    let want = pattern(LEN, 99);
    remote_buf.bytes_mut().copy_from_slice(&want);
    // SAFETY: the buffers outlive their registrations; the read is waited for.
    let lmr = unsafe { a.ep.register(local.ptr(), LEN, FI_READ) }.expect("register");
    // SAFETY: as above.
    let rmr = unsafe { b.ep.register(remote_buf.ptr(), LEN, FI_REMOTE_READ) }.expect("register");
    let remote = Remote {
        dest: a_to_b,
        addr: rmr.remote_addr(remote_buf.ptr()).expect("start"),
        key: rmr.key(),
    };
    post_retry(&mut [&mut a, &mut b], "fi_read", |s| {
        // SAFETY: local is not touched until the completion is read.
        unsafe { s[0].ep.read(local.ptr(), LEN, lmr.desc(), remote, 77) }
    });
    drive(&mut [&mut a, &mut b], "read", |s| has_ctx(s[0], 77));
    let c = take_ctx(&mut a, 77);
    assert!(
        c[0].flags & FI_READ != 0,
        "{prov}: read flags {:#x}",
        c[0].flags
    );
    assert!(local.bytes() == &want[..], "{prov}: read bytes differ");
}

fn wait_fd_and_trywait(prov: &str) {
    let Some((mut a, mut b, a_to_b, _)) = pair(prov) else {
        return;
    };
    let Some(fd) = b.ep.wait_fd() else {
        println!("{prov}: no FI_WAIT_FD: {:?}", b.ep.wait_refused());
        return;
    };
    let r = Buf::new(64);
    // A first message sets up the connection (rxm connects on first use).
    // SAFETY: r outlives the receives, which are waited for.
    unsafe { b.ep.recv(r.ptr(), 64, None, 1) }.expect("recv");
    post_retry(&mut [&mut a, &mut b], "fi_inject", |s| {
        s[0].ep.inject(b"hello", a_to_b)
    });
    drive(&mut [&mut a, &mut b], "the first message", |s| {
        has_ctx(s[1], 1)
    });
    // SAFETY: as above.
    unsafe { b.ep.recv(r.ptr(), 64, None, 2) }.expect("recv");
    // Nothing can be pending on b's queue once it has been read empty.
    let start = std::time::Instant::now();
    while !b.ep.trywait().expect("fi_trywait") {
        poll(&mut b, "draining");
        assert!(
            start.elapsed() < DEADLINE,
            "{prov}: fi_trywait never allowed sleeping"
        );
    }
    // a sends after a pause, from another thread, while b sleeps in poll.
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(300);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(PAUSE);
        post_retry(&mut [&mut a], "fi_inject", |s| {
            s[0].ep.inject(b"wake up", a_to_b)
        });
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_secs(2) {
            poll(&mut a, "sender progress");
        }
    });
    let slept = std::time::Instant::now();
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 10_000) };
    let woke_after = slept.elapsed();
    drive(&mut [&mut b], "the message after the wake-up", |s| {
        has_ctx(s[0], 2)
    });
    sender.join().expect("sender thread");
    println!("{prov}: FI_WAIT_FD fd {fd}: poll returned {n} after {woke_after:?}");
    assert_eq!(n, 1, "{prov}: the wait fd never became readable");
    assert!(
        woke_after >= PAUSE / 2,
        "{prov}: woke after {woke_after:?}, before anything was sent"
    );
    assert_eq!(&r.bytes()[..7], b"wake up");
}

fn registration_cache(prov: &str) {
    let Some(side) = open(prov) else { return };
    let buf = Buf::new(1 << 20);
    let mut cache = RegCache::new();
    // SAFETY: buf outlives the cache (declared before it, dropped after).
    let whole = unsafe { cache.register(&side.ep, buf.ptr(), buf.len(), FI_SEND | FI_RECV) }
        .expect("register");
    // SAFETY: as above; inside buf.
    let part =
        unsafe { cache.register(&side.ep, buf.ptr().add(4096), 4096, FI_SEND) }.expect("register");
    assert!(
        std::sync::Arc::ptr_eq(&whole, &part),
        "{prov}: a covered range is a hit"
    );
    assert_eq!((cache.hits(), cache.misses()), (1, 1));
    // SAFETY: as above.
    let remote =
        unsafe { cache.register(&side.ep, buf.ptr(), 4096, FI_REMOTE_WRITE) }.expect("register");
    assert!(
        !std::sync::Arc::ptr_eq(&whole, &remote),
        "{prov}: more access is a miss"
    );
    assert_eq!(cache.misses(), 2);
    if !side.ep.info().mr(FI_MR_PROV_KEY) {
        assert_ne!(
            whole.key(),
            remote.key(),
            "{prov}: requested keys are unique"
        );
    }
    assert_eq!(cache.invalidate(buf.ptr(), 1), 2);
    assert!(cache.is_empty());
    // SAFETY: as above.
    let again = unsafe { cache.register(&side.ep, buf.ptr(), 4096, FI_SEND) }.expect("register");
    assert!(!std::sync::Arc::ptr_eq(&whole, &again));
    assert_eq!(cache.misses(), 3);
}

/// Waits for an error completion on `side`, progressing `other` too.
fn await_error(
    side: &mut Side,
    other: &mut Side,
    what: &str,
    limit: std::time::Duration,
) -> Option<Error> {
    let start = std::time::Instant::now();
    let mut out = [Completion::default(); 16];
    while start.elapsed() < limit {
        match side.ep.poll_cq(&mut out) {
            Ok(n) => side.seen.extend_from_slice(&out[..n]),
            Err(e) => return Some(e),
        }
        poll(other, what);
    }
    None
}

fn failed_operations(prov: &str) {
    let Some((mut a, mut b, a_to_b, _)) = pair(prov) else {
        return;
    };
    // A message longer than the receive posted for it: the receive fails
    // with FI_ETRUNC and its context comes back in the error.
    let small = Buf::new(16);
    // SAFETY: small outlives the receive, which is waited for.
    unsafe { b.ep.recv(small.ptr(), 16, None, 31) }.expect("recv");
    post_retry(&mut [&mut a, &mut b], "fi_inject", |s| {
        s[0].ep.inject(&[7u8; 48], a_to_b)
    });
    let err = await_error(&mut b, &mut a, "a truncated receive", DEADLINE)
        .unwrap_or_else(|| panic!("{prov}: no error for a truncated receive: {:x?}", b.seen));
    println!("{prov}: truncated receive: {err}");
    match err {
        Error::Completion {
            ctx,
            flags,
            errno,
            ref text,
            ..
        } => {
            assert_eq!(ctx, Some(31), "{prov}: {err}");
            assert_eq!(errno, FI_ETRUNC, "{prov}: FI_ETRUNC expected: {err}");
            assert!(flags & FI_RECV != 0, "{prov}: flags {flags:#x}");
            assert!(!text.is_empty());
        }
        e => panic!("{prov}: {e}"),
    }
    assert_eq!(
        b.ep.in_flight(),
        0,
        "{prov}: the failed receive's context is freed"
    );

    // A write with a key nobody registered: providers that check keys at
    // the target report it to the writer.
    let dst = Buf::new(4096);
    let mut src = Buf::new(4096);
    src.bytes_mut().fill(0xee);
    // SAFETY: both outlive their registrations; the write is waited for.
    let dmr = unsafe { b.ep.register(dst.ptr(), 4096, FI_REMOTE_WRITE) }.expect("register");
    // SAFETY: as above.
    let smr = unsafe { a.ep.register(src.ptr(), 4096, FI_WRITE) }.expect("register");
    let remote = Remote {
        dest: a_to_b,
        addr: dmr.remote_addr(dst.ptr()).expect("start"),
        key: dmr.key().wrapping_add(0x5151),
    };
    post_retry(&mut [&mut a, &mut b], "fi_write", |s| {
        // SAFETY: src is not modified until the write completes or fails.
        unsafe { s[0].ep.write(src.ptr(), 4096, smr.desc(), remote, 41) }
    });
    match await_error(
        &mut a,
        &mut b,
        "a write with a bad key",
        std::time::Duration::from_secs(3),
    ) {
        Some(e @ Error::Completion { .. }) => {
            println!("{prov}: bad key: {e}");
            assert!(matches!(e, Error::Completion { ctx: Some(41), .. }), "{e}");
        }
        Some(e) => panic!("{prov}: {e}"),
        None => println!(
            "{prov}: a write with a bad key reported no error (completions {:x?}); the target \
             region {} written",
            a.seen,
            if dst.bytes().iter().any(|&x| x != 0) {
                "was"
            } else {
                "was not"
            }
        ),
    }
}

#[test]
fn unknown_provider_lists_the_available_ones() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let err = Fabric::open(Some("nosuch"))
        .err()
        .expect("no provider is called nosuch");
    let msg = err.to_string();
    assert!(matches!(err, Error::UnknownProvider { .. }), "{msg}");
    assert!(msg.contains("\"nosuch\" is not available"), "{msg}");
    assert!(msg.contains("tcp"), "{msg}");
    println!("{msg}");
}

#[test]
fn a_provider_without_rma_is_named_with_what_it_lacks() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    // Plain udp has datagram endpoints only.
    if !providers().expect("providers").iter().any(|p| p == "udp") {
        println!("skipped: no udp provider");
        return;
    }
    let err = Fabric::open(Some("udp"))
        .err()
        .expect("udp has no RDM endpoint with RMA");
    let msg = err.to_string();
    assert!(matches!(err, Error::MissingCapability { .. }), "{msg}");
    assert!(msg.contains("FI_RMA"), "{msg}");
    println!("{msg}");
}

#[test]
fn shm_negotiates_virtual_addresses() {
    let Some(side) = open("shm") else { return };
    let info = side.ep.info();
    println!(
        "shm: mr_mode {} mode {}",
        info.mr_mode_names(),
        info.mode_names()
    );
    assert!(
        info.mr(FI_MR_VIRT_ADDR),
        "shm mr_mode {}",
        info.mr_mode_names()
    );
    let buf = Buf::new(4096);
    // SAFETY: buf outlives the registration.
    let mr = unsafe { side.ep.register(buf.ptr(), 4096, FI_REMOTE_WRITE) }.expect("register");
    // SAFETY: inside buf.
    let p = unsafe { buf.ptr().add(100) };
    assert_eq!(mr.remote_addr(p), Some(p as u64));
}

#[test]
fn no_provider_named_picks_the_first_usable_and_says_why() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let f = Fabric::open(None).expect("some provider");
    println!("{}", f.choice());
    assert!(f.choice().starts_with("verbs;ofi_rxm: "), "{}", f.choice());
    assert!(
        f.choice()
            .ends_with(&format!("chose {}", f.info().provider)),
        "{}",
        f.choice()
    );
    assert!(PREFERRED_PROVIDERS.contains(&f.info().provider.as_str()));
}

#[test]
fn what_each_provider_negotiates() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    println!(
        "libfabric {:?}; providers {:?}",
        version(),
        providers().expect("providers")
    );
    for prov in ["tcp;ofi_rxm", "shm", "sockets", "udp;ofi_rxd"] {
        let Some(side) = open(prov) else { continue };
        let i = side.ep.info();
        println!(
            "{prov}: fabric {:?} domain {:?} mr_mode {} mode {} cq_data_size {} max_msg_size {} \
             inject_size {} tx {} rx {} key {} B progress {:?}/{:?} threading {} wait_fd {:?} {}",
            i.fabric,
            i.domain,
            i.mr_mode_names(),
            i.mode_names(),
            i.cq_data_size,
            i.max_msg_size,
            i.inject_size,
            i.tx_size,
            i.rx_size,
            i.mr_key_size,
            i.data_progress,
            i.control_progress,
            i.threading,
            side.ep.wait_fd(),
            side.ep
                .wait_refused()
                .map(|c| c.to_string())
                .unwrap_or_default(),
        );
        assert_eq!(&i.provider, prov);
        assert!(i.cq_data_size >= 4 && i.caps & FI_RMA != 0);
    }
}

#[test]
fn device_memory_needs_a_provider_with_fi_hmem_and_says_so() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    // libfabric 1.17's tcp provider offers no FI_HMEM: the query, the
    // opening and the registration each say so.
    let why = hmem_support("tcp;ofi_rxm").expect("fi_getinfo");
    println!("tcp;ofi_rxm: {why:?}");
    let why = why.expect("tcp;ofi_rxm has no FI_HMEM in libfabric 1.17");
    assert!(why.contains("FI_HMEM"), "{why}");
    let err = Fabric::open_hmem(Some("tcp;ofi_rxm"))
        .err()
        .expect("no FI_HMEM");
    let msg = err.to_string();
    assert!(matches!(err, Error::MissingCapability { .. }), "{msg}");
    assert!(msg.contains("FI_HMEM"), "{msg}");
    // A fabric opened without FI_HMEM refuses device memory before
    // libfabric sees it.
    let f = Fabric::open(Some("tcp;ofi_rxm")).expect("tcp");
    let d = Domain::open(&f).expect("domain");
    let buf = Buf::new(4096);
    // SAFETY: refused before anything is registered.
    let Err(err) = (unsafe { d.register_cuda(buf.ptr(), 4096, FI_REMOTE_WRITE, 0) }) else {
        panic!("registered device memory on a fabric opened without FI_HMEM");
    };
    let msg = err.to_string();
    assert!(matches!(err, Error::Usage(_)), "{msg}");
    assert!(msg.contains("without FI_HMEM"), "{msg}");
}

#[test]
fn shm_opened_with_fi_hmem_registers_device_memory_through_fi_mr_regattr() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    assert_eq!(
        hmem_support("shm").expect("fi_getinfo"),
        None,
        "shm offers FI_HMEM"
    );
    let f = Fabric::open_hmem(Some("shm")).expect("shm with FI_HMEM");
    assert!(f.info().caps & FI_HMEM != 0);
    assert!(f.info().mr(FI_MR_HMEM), "{}", f.info().mr_mode_names());
    let d = Domain::open(&f).expect("domain");
    let buf = Buf::new(4096);
    // Host memory declared as GPU 0's. Where no CUDA driver exists
    // libfabric's CUDA interface is absent, and the error names the call
    // that refused; a real device buffer is the GPU check's business.
    // SAFETY: buf outlives the attempt.
    let r = unsafe { d.register_cuda(buf.ptr(), 4096, FI_REMOTE_WRITE, 0) };
    println!("{:?}", r.as_ref().map(|_| "registered"));
    // SAFETY: probing for the driver runs only its initialisers.
    let cuda = unsafe { libloading::Library::new("libcuda.so.1") }.is_ok();
    if !cuda {
        match r {
            Err(Error::Register { call, .. }) => assert_eq!(call.call, "fi_mr_regattr"),
            Err(e) => panic!("refused by something else: {e}"),
            Ok(_) => panic!("registered CUDA memory with no CUDA driver on the machine"),
        }
    }
}
