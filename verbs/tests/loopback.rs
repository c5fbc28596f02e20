//! Two queue pairs on one device, connected to each other: bring-up, RDMA
//! WRITE WITH IMM of 1 B, 4 KiB and 8 MiB with the immediate and the bytes
//! checked, 64 writes in flight, the completion channel's wake-up, and a
//! wrong remote key reported with its advice.
//!
//! They need a device, so they are ignored by default; on a machine with
//! one (a soft-RoCE device will do: `rdma link add rxe0 type rxe netdev
//! eth0`), run
//! `GW_TEST_RDMA_DEVICE=rxe0 cargo test -p gw-verbs --features verbs -- --ignored`
//! (`GW_IB_GID_INDEX` is honoured).

#![cfg(feature = "verbs")]

use gw_verbs::port::HcaChoice;
use gw_verbs::{
    CompChannel, Completion, CompletionQueue, Config, Error, Hca, Opcode, ProtectionDomain, Qp,
    QpEndpoint, QpOptions, ReadyToSend, RegisteredBuffer,
};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Shows a failing test's error by its message rather than its fields.
struct Shown(String);

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Error> for Shown {
    fn from(e: Error) -> Shown {
        Shown(e.to_string())
    }
}

type TestResult = Result<(), Shown>;

fn fail<T>(msg: impl Into<String>) -> Result<T, Shown> {
    Err(Shown(msg.into()))
}

/// A device, a protection domain, and two connected queue pairs `a` and `b`,
/// each with its own completion queue on one channel.
struct Pair {
    hca: Hca,
    pd: ProtectionDomain,
    channel: CompChannel,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    a: Qp<ReadyToSend>,
    b: Qp<ReadyToSend>,
}

fn config() -> Result<Config, Shown> {
    let Some(device) = std::env::var_os("GW_TEST_RDMA_DEVICE") else {
        return fail("set GW_TEST_RDMA_DEVICE to the RDMA device to test (ibv_devices lists them)");
    };
    let mut cfg = Config::from_env()?;
    cfg.hca = HcaChoice::parse(&device.to_string_lossy())?;
    Ok(cfg)
}

fn pair() -> Result<Pair, Shown> {
    let hca = gw_verbs::open(&config()?)?;
    let pd = hca.alloc_pd()?;
    let channel = hca.create_comp_channel()?;
    let cq_a = hca.create_cq(1024, Some(&channel))?;
    let cq_b = hca.create_cq(1024, Some(&channel))?;
    let opts = QpOptions {
        send_depth: 128,
        recv_depth: 128,
        ..QpOptions::default()
    };
    let a = hca.create_qp(&pd, &cq_a, &cq_a, &opts)?;
    let b = hca.create_qp(&pd, &cq_b, &cq_b, &opts)?;
    // Through the codec, as the rendezvous store would carry them.
    let ea = QpEndpoint::decode(&a.endpoint().encode())?;
    let eb = QpEndpoint::decode(&b.endpoint().encode())?;
    assert_eq!(ea, a.endpoint());
    assert_ne!(ea.qpn, eb.qpn);
    let a = a.into_init()?;
    let b = b.into_init()?;
    let a = a.into_rtr(&eb)?.into_rts()?;
    let b = b.into_rtr(&ea)?.into_rts()?;
    Ok(Pair {
        hca,
        pd,
        channel,
        cq_a,
        cq_b,
        a,
        b,
    })
}

/// Polls `cq` until `n` completions have come, failing on an error status
/// or after 10 s.
fn wait(cq: &mut CompletionQueue, n: usize) -> Result<Vec<Completion>, Shown> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::with_capacity(n);
    let mut buf = [Completion::default(); 16];
    while got.len() < n {
        let k = cq.poll(&mut buf)?;
        for c in &buf[..k] {
            got.push(c.ok()?);
        }
        if Instant::now() > deadline {
            return fail(format!("only {} of {n} completions after 10 s", got.len()));
        }
    }
    Ok(got)
}

fn pattern(buf: &mut RegisteredBuffer, seed: u8) {
    // SAFETY: nothing is posted on this buffer yet.
    let bytes = unsafe { buf.bytes_mut() };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

/// One write with immediate of `len` bytes from a to b, checked.
fn write_once(
    p: &mut Pair,
    src: &RegisteredBuffer,
    dst: &RegisteredBuffer,
    len: usize,
    imm: u32,
) -> TestResult {
    p.b.post_recv(100, None)?;
    p.a.post_write_imm(7, src.region().slice(0, len)?, dst.region().remote(0), imm)?;
    let sent = wait(&mut p.cq_a, 1)?;
    assert_eq!(sent[0].wr_id, 7);
    assert_eq!(sent[0].opcode, Opcode::RdmaWrite);
    let landed = wait(&mut p.cq_b, 1)?;
    assert_eq!(landed[0].wr_id, 100);
    assert_eq!(landed[0].opcode, Opcode::RecvRdmaWithImm);
    assert_eq!(landed[0].imm, Some(imm));
    assert_eq!(landed[0].byte_len as usize, len);
    // SAFETY: the write has completed and nothing else targets dst.
    let (s, d) = unsafe { (src.bytes(), dst.bytes()) };
    if s[..len] != d[..len] {
        return fail(format!("the {len} bytes written differ from the source"));
    }
    Ok(())
}

#[test]
#[ignore = "needs an RDMA device: set GW_TEST_RDMA_DEVICE"]
fn bring_up() -> TestResult {
    let p = pair()?;
    let ep = p.a.endpoint();
    assert_eq!(ep.mtu, p.hca.port().active_mtu);
    assert_eq!(ep.gid, p.hca.gid().gid);
    eprintln!(
        "{} port {}: {}; queue pairs {:#x} and {:#x}",
        p.hca.name(),
        p.hca.port().num,
        p.hca.gid().reason,
        p.a.qpn(),
        p.b.qpn()
    );
    Ok(())
}

#[test]
#[ignore = "needs an RDMA device: set GW_TEST_RDMA_DEVICE"]
fn write_with_imm_1b_4kib_8mib() -> TestResult {
    let mut p = pair()?;
    let mut src = p.pd.alloc_buffer(8 << 20)?;
    let dst = p.pd.alloc_buffer(8 << 20)?;
    pattern(&mut src, 5);
    for (len, imm) in [
        (1, 0x0102_0304),
        (4096, 0xdead_beef),
        (8 << 20, 0xffff_ffff),
    ] {
        write_once(&mut p, &src, &dst, len, imm)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs an RDMA device: set GW_TEST_RDMA_DEVICE"]
fn sixty_four_writes_in_flight() -> TestResult {
    const N: usize = 64;
    const SEG: usize = 64 << 10;
    let mut p = pair()?;
    let mut src = p.pd.alloc_buffer(N * SEG)?;
    let dst = p.pd.alloc_buffer(N * SEG)?;
    pattern(&mut src, 9);
    for i in 0..N {
        p.b.post_recv(1000 + i as u64, None)?;
    }
    for i in 0..N {
        let off = i * SEG;
        p.a.post_write_imm(
            i as u64,
            src.region().slice(off, SEG)?,
            dst.region().remote(off as u64),
            i as u32,
        )?;
    }
    let mut sent: Vec<u64> = wait(&mut p.cq_a, N)?.iter().map(|c| c.wr_id).collect();
    sent.sort_unstable();
    assert_eq!(sent, (0..N as u64).collect::<Vec<_>>());
    let landed = wait(&mut p.cq_b, N)?;
    // RC delivers in order: receives complete in posting order, immediates
    // in writing order.
    for (i, c) in landed.iter().enumerate() {
        assert_eq!(c.wr_id, 1000 + i as u64);
        assert_eq!(c.imm, Some(i as u32));
        assert_eq!(c.byte_len as usize, SEG);
    }
    // SAFETY: every write has completed.
    let (s, d) = unsafe { (src.bytes(), dst.bytes()) };
    if s != d {
        return fail("the bytes written differ from the source");
    }
    Ok(())
}

#[test]
#[ignore = "needs an RDMA device: set GW_TEST_RDMA_DEVICE"]
fn the_channel_wakes_a_sleeper() -> TestResult {
    let mut p = pair()?;
    let mut src = p.pd.alloc_buffer(4096)?;
    let dst = p.pd.alloc_buffer(4096)?;
    pattern(&mut src, 1);
    p.cq_b.arm()?;
    // Nothing yet: the descriptor is not readable and drain finds nothing.
    assert_eq!(p.channel.drain()?, 0);
    p.b.post_recv(1, None)?;
    p.a.post_write_imm(2, src.region().slice(0, 4096)?, dst.region().remote(0), 42)?;
    let mut fd = libc::pollfd {
        fd: p.channel.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut fd, 1, 5000) };
    if n != 1 {
        return fail(format!(
            "the completion channel did not become readable (poll returned {n})"
        ));
    }
    assert!(p.channel.drain()? >= 1);
    let landed = wait(&mut p.cq_b, 1)?;
    assert_eq!(landed[0].imm, Some(42));
    wait(&mut p.cq_a, 1)?;
    Ok(())
}

#[test]
#[ignore = "needs an RDMA device: set GW_TEST_RDMA_DEVICE"]
fn a_wrong_rkey_says_so() -> TestResult {
    let mut p = pair()?;
    let src = p.pd.alloc_buffer(4096)?;
    let dst = p.pd.alloc_buffer(4096)?;
    p.b.post_recv(1, None)?;
    let mut bad = dst.region().remote(0);
    bad.rkey ^= 0x00ff_ff00;
    p.a.post_write_imm(3, src.region().slice(0, 64)?, bad, 1)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [Completion::default(); 1];
    while p.cq_a.poll(&mut buf)? == 0 {
        if Instant::now() > deadline {
            return fail("no completion for a write with a wrong rkey");
        }
    }
    let err = match buf[0].ok() {
        Ok(c) => return fail(format!("a write with a wrong rkey succeeded: {c:?}")),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("IBV_WC_REM_ACCESS_ERR"), "{err}");
    assert!(err.contains("remote key or address wrong"), "{err}");
    Ok(())
}
