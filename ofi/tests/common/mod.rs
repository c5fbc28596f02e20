//! Helpers shared by the integration tests: opening endpoints on a named
//! provider (or saying why a provider is skipped), page-aligned buffers,
//! and a progress loop bounded by a deadline, so a test fails with a
//! message instead of hanging.

#![allow(dead_code)]

use gw_ofi::*;
use std::time::{Duration, Instant};

/// How long any one wait may take.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Why the real tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    library().err().map(|e| e.to_string())
}

/// One side of a test: its endpoint, with the domain that owns it.
pub struct Side {
    pub domain: Domain,
    pub ep: Endpoint,
    pub seen: Vec<Completion>,
}

/// Opens an endpoint on `prov`; `None`, with a printed reason, when the
/// library is missing or fi_getinfo says the provider is not present.
pub fn open(prov: &str) -> Option<Side> {
    if let Some(why) = skip_reason() {
        println!("skipped {prov}: {why}");
        return None;
    }
    let fabric = match Fabric::open(Some(prov)) {
        Ok(f) => f,
        Err(e @ Error::UnknownProvider { .. }) => {
            println!("skipped {prov}: {e}");
            return None;
        }
        Err(e) => panic!("opening {prov}: {e}"),
    };
    let domain = Domain::open(&fabric).unwrap_or_else(|e| panic!("{prov}: {e}"));
    let ep =
        Endpoint::open(&domain, &EpConfig::default()).unwrap_or_else(|e| panic!("{prov}: {e}"));
    Some(Side {
        domain,
        ep,
        seen: Vec::new(),
    })
}

/// Two endpoints on `prov` that know each other: (a, b, a's address of b,
/// b's address of a).
pub fn pair(prov: &str) -> Option<(Side, Side, FiAddr, FiAddr)> {
    let mut a = open(prov)?;
    let mut b = open(prov)?;
    let an = a.ep.name().expect("fi_getname");
    let bn = b.ep.name().expect("fi_getname");
    let a_to_b = a.ep.insert_peer(&bn).expect("fi_av_insert");
    let b_to_a = b.ep.insert_peer(&an).expect("fi_av_insert");
    Some((a, b, a_to_b, b_to_a))
}

/// A zeroed, page-aligned buffer (registration likes whole pages).
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

impl Buf {
    pub fn new(len: usize) -> Buf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocating {len} bytes");
        Buf { ptr, len }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes. Only call while no transfer into the buffer is in flight.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes; the caller has no transfer
        // writing it in flight.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Mutable bytes. Only call while no transfer uses the buffer.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as bytes, with &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), 4096).expect("layout");
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// A byte pattern that differs per size and seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Reads `side`'s completion queue once, keeping what it returns; panics
/// on a failed operation.
pub fn poll(side: &mut Side, what: &str) -> usize {
    let mut out = [Completion::default(); 16];
    match side.ep.poll_cq(&mut out) {
        Ok(n) => {
            side.seen.extend_from_slice(&out[..n]);
            n
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Progresses every side until `done` holds, for at most [`DEADLINE`].
pub fn drive(sides: &mut [&mut Side], what: &str, mut done: impl FnMut(&[&mut Side]) -> bool) {
    let start = Instant::now();
    while !done(sides) {
        for s in sides.iter_mut() {
            poll(s, what);
        }
        if start.elapsed() > DEADLINE {
            let seen: Vec<String> = sides.iter().map(|s| format!("{:x?}", s.seen)).collect();
            panic!("{what}: not done after {DEADLINE:?}; completions seen: {seen:?}");
        }
    }
}

/// Retries `post` while it says [`Error::Again`], progressing every side
/// in between, for at most [`DEADLINE`].
pub fn post_retry(
    sides: &mut [&mut Side],
    what: &str,
    mut post: impl FnMut(&mut [&mut Side]) -> Result<()>,
) {
    let start = Instant::now();
    loop {
        match post(sides) {
            Ok(()) => return,
            Err(Error::Again) => {}
            Err(e) => panic!("{what}: {e}"),
        }
        for s in sides.iter_mut() {
            poll(s, what);
        }
        if start.elapsed() > DEADLINE {
            panic!("{what}: still no room after {DEADLINE:?}");
        }
    }
}

/// Takes the completions of `side` whose context is `ctx`.
pub fn take_ctx(side: &mut Side, ctx: u64) -> Vec<Completion> {
    let (hit, rest) = side.seen.drain(..).partition(|c| c.ctx == Some(ctx));
    side.seen = rest;
    hit
}

/// Whether `side` has seen a completion with `ctx`.
pub fn has_ctx(side: &Side, ctx: u64) -> bool {
    side.seen.iter().any(|c| c.ctx == Some(ctx))
}

/// Whether `side` has seen immediate data `imm`.
pub fn has_imm(side: &Side, imm: u64) -> bool {
    side.seen
        .iter()
        .any(|c| c.flags & FI_REMOTE_CQ_DATA != 0 && c.data == imm)
}

/// Under `FI_RX_CQ_DATA` a peer's immediate consumes a posted receive:
/// post `n` empty ones with contexts starting at `ctx0`.
pub fn post_cq_data_receives(side: &mut Side, n: u64, ctx0: u64) {
    if side.ep.info().mode & FI_RX_CQ_DATA == 0 {
        return;
    }
    for i in 0..n {
        let mut me = [&mut *side];
        post_retry(&mut me, "posting a receive for immediate data", |s| {
            // SAFETY: a zero-length receive touches no memory.
            unsafe {
                s[0].ep.recv(
                    std::ptr::NonNull::<u8>::dangling().as_ptr(),
                    0,
                    None,
                    ctx0 + i,
                )
            }
        });
    }
}
