//! Buffers registered once (`Communicator::register_raw`, NCCL's
//! `ncclCommRegister`): over libfabric (whose registration pins memory on a
//! NIC), operations on memory inside a registered range register nothing,
//! whatever their offset and size, and their results are right; the same
//! operations on unregistered memory do register (so the count is not
//! blind). TCP and shm lend no registrations (theirs are table entries),
//! so there the operations register their own, and are right.
//! Deregistering waits for earlier operations on the range and succeeds
//! once; bad ranges are refused. At 2 and 3 ranks.

// Only its rank runner is used here.
#[allow(dead_code)]
mod common;

use common::on_each_rank;
use gw_collectives::local::local_world;
use gw_collectives::{
    Communicator, DType, Error, OpKind, RawOp, RedOp, TransportChoice, registrations,
};
use rand::{Rng, SeedableRng};
use std::sync::Mutex;

/// Elements of each rank's registered buffer (f32).
const LEN: usize = 3 << 18;
/// Operations per phase.
const OPS: usize = 24;

fn all_reduce(send: *const f32, recv: *mut f32, count: usize) -> RawOp {
    RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::F32,
        redop: RedOp::Sum,
        count,
        root: 0,
        send: send.cast(),
        recv: recv.cast(),
        weight: None,
    }
}

/// A one-element all-reduce at `buf[at]`: a barrier that, on registered
/// memory, registers nothing itself.
fn sync(c: &Communicator, buf: &mut [f32], at: usize) -> Result<(), Error> {
    let p = buf[at..].as_mut_ptr();
    // SAFETY: in place on one element of buf, which outlives the wait.
    unsafe { c.run_raw(all_reduce(p, p, 1), None) }
}

/// `OPS` all-reduces and ring messages on random parts of `buf` (sizes 16
/// KiB to 1 MiB, in place and out of place), every result checked.
fn phase(c: &Communicator, buf: &mut [f32], seed: u64) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let err = |e: Error| format!("rank {me}: {e}");
    for k in 0..OPS {
        // Every rank draws the same sizes and offsets.
        let count = rng.random_range(4096..=(1 << 18));
        let src = rng.random_range(0..LEN / 2 - count);
        let dst = LEN / 2 + rng.random_range(0..LEN / 2 - count);
        let in_place = k % 3 == 0;
        let value = |i: usize, r: u32| ((i * 7 + k) % 1000) as f32 + r as f32;
        for i in 0..count {
            buf[src + i] = value(i, me);
        }
        let out = if in_place { src } else { dst };
        let p = buf.as_mut_ptr();
        // SAFETY: both ranges lie in buf, which outlives the blocking call.
        unsafe { c.run_raw(all_reduce(p.add(src), p.add(out), count), None) }.map_err(err)?;
        let ranks: f32 = (0..n).map(|r| r as f32).sum();
        for i in (0..count).step_by(97) {
            let want = ((i * 7 + k) % 1000) as f32 * n as f32 + ranks;
            if buf[out + i] != want {
                return Err(format!(
                    "rank {me}: op {k} ({count} floats at {out}): [{i}] = {}, not {want}",
                    buf[out + i]
                ));
            }
        }
        // A ring message: to the next rank, from the previous one.
        for i in 0..count {
            buf[src + i] = value(i, me);
        }
        if n > 1 {
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            // Each half on its own (the other half of each call is empty).
            // SAFETY: disjoint halves of buf; both outlive the waits.
            let (s, r) = unsafe {
                let s = c.sendrecv_raw(
                    DType::F32,
                    Some((next, p.add(src).cast_const().cast(), count)),
                    None,
                );
                let r = c.sendrecv_raw(DType::F32, None, Some((prev, p.add(dst).cast(), count)));
                (s.map_err(err)?, r.map_err(err)?)
            };
            s.wait().and_then(|_| r.wait()).map_err(err)?;
            for i in (0..count).step_by(101) {
                if buf[dst + i] != value(i, prev) {
                    return Err(format!(
                        "rank {me}: send {k} from {prev} landed wrong at {i}"
                    ));
                }
            }
            // SAFETY: disjoint halves of buf; it outlives the wait.
            unsafe {
                c.sendrecv_raw(
                    DType::F32,
                    Some((next, p.add(src).cast_const().cast(), count)),
                    Some((prev, p.add(dst).cast(), count)),
                )
            }
            .and_then(|h| h.wait())
            .map_err(err)?;
            for i in (0..count).step_by(89) {
                if buf[dst + i] != value(i, prev) {
                    return Err(format!(
                        "rank {me}: message {k} from {prev} landed wrong at {i}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The registration count is process-wide: one check at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `lends`: whether the transport lends caller registrations.
fn check(
    t: TransportChoice,
    provider: Option<&'static str>,
    lends: bool,
    n: u32,
    key: &'static str,
) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (_store, comms) = local_world(n, key, move |_, cfg| {
        cfg.transport.set(t);
        cfg.ofi_provider.set(provider.map(String::from));
    })
    .expect("communicators");
    on_each_rank(comms, key, move |c| {
        let me = c.rank();
        let err = |e: Error| format!("{key} rank {me}: {e}");
        let mut buf = vec![0f32; LEN];
        // SAFETY: buf outlives the registration (deregistered below).
        let reg = unsafe { c.register_raw(buf.as_mut_ptr().cast(), LEN * 4) }.map_err(err)?;
        // Once unmeasured: scratch grows to what these operations need.
        phase(&c, &mut buf, 7).map_err(|e| format!("{key}: registered: {e}"))?;
        sync(&c, &mut buf, 0).map_err(err)?;
        let before = registrations();
        phase(&c, &mut buf, 7).map_err(|e| format!("{key}: registered: {e}"))?;
        sync(&c, &mut buf, 0).map_err(err)?;
        // Every rank's operations on registered memory are done.
        let during = registrations() - before;
        sync(&c, &mut buf, 1).map_err(err)?;
        if lends && during != 0 {
            return Err(format!(
                "{key} rank {me}: {during} registrations while every buffer lay in a registered range"
            ));
        }
        if !lends && during == 0 {
            return Err(format!(
                "{key} rank {me}: a transport that lends no registrations registered nothing"
            ));
        }
        // A non-blocking operation not waited for: deregistering waits for it.
        let p = buf.as_mut_ptr();
        for v in &mut buf[..1000] {
            *v = 1.0;
        }
        // SAFETY: buf[..1000] is not touched until the handle is waited.
        let h = unsafe { c.submit_raw(all_reduce(p, p, 1000), None) }.map_err(err)?;
        c.deregister(&reg).map_err(err)?;
        // Once only.
        match c.deregister(&reg) {
            Err(Error::InvalidUsage(m)) if m.contains("not registered") => {}
            other => return Err(format!("{key} rank {me}: deregistered twice: {other:?}")),
        }
        h.wait().map_err(err)?;
        if buf[..1000].iter().any(|&v| v != n as f32) {
            return Err(format!(
                "{key} rank {me}: the all-reduce before deregister went wrong"
            ));
        }
        // The same work on memory no longer registered registers.
        let mut other = vec![0f32; LEN];
        sync(&c, &mut other, 0).map_err(err)?;
        let before = registrations();
        phase(&c, &mut other, 7).map_err(|e| format!("{key}: unregistered: {e}"))?;
        if registrations() == before {
            return Err(format!(
                "{key} rank {me}: no registration counted on unregistered memory"
            ));
        }
        Ok(())
    });
}

#[test]
fn registered_buffers_are_not_registered_again_ofi_tcp() {
    check(
        TransportChoice::Ofi,
        Some("tcp;ofi_rxm"),
        true,
        2,
        "reg-ofitcp2",
    );
    check(
        TransportChoice::Ofi,
        Some("tcp;ofi_rxm"),
        true,
        3,
        "reg-ofitcp3",
    );
}

#[test]
fn registered_buffers_are_not_registered_again_ofi_shm() {
    check(TransportChoice::Ofi, Some("shm"), true, 2, "reg-ofishm2");
    check(TransportChoice::Ofi, Some("shm"), true, 3, "reg-ofishm3");
}

#[test]
fn shm_and_tcp_lend_nothing_and_stay_right() {
    check(TransportChoice::Shm, None, false, 2, "reg-shm2");
    check(TransportChoice::Tcp, None, false, 3, "reg-tcp3");
}

#[test]
fn empty_or_null_ranges_are_refused() {
    let key = "reg-bad";
    let (_store, comms) =
        local_world(1, key, |_, cfg| cfg.transport.set(TransportChoice::Shm)).expect("comm");
    for c in comms {
        let mut x = [0u8; 4];
        for (p, n) in [(std::ptr::null_mut(), 16), (x.as_mut_ptr(), 0)] {
            // SAFETY: refused before anything is registered.
            let e = unsafe { c.register_raw(p, n) }.unwrap_err().to_string();
            assert!(e.contains("non-null pointer and at least one byte"), "{e}");
        }
    }
}
