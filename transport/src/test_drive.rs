//! Driving two transports of one process by hand until their requests are
//! done: what every backend's tests do between posting and checking, and
//! the buffers they register for it.

use crate::seam::{MemHandle, Outstanding, Transport};
use std::time::{Duration, Instant};

/// Progresses `a` and `b` until every request of `ra` (on `a`) and `rb`
/// (on `b`) completes; fails the test past `limit`.
pub(crate) fn run_both<T: Transport>(
    a: &mut T,
    b: &mut T,
    ra: Vec<impl Into<Outstanding>>,
    rb: Vec<impl Into<Outstanding>>,
    limit: Duration,
) {
    let mut ra: Vec<Outstanding> = ra.into_iter().map(Into::into).collect();
    let mut rb: Vec<Outstanding> = rb.into_iter().map(Into::into).collect();
    let deadline = Instant::now() + limit;
    while !(ra.is_empty() && rb.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "transfers did not finish: {ra:?} {rb:?}"
        );
        a.progress().unwrap();
        b.progress().unwrap();
        ra.retain_mut(|r| !r.poll(&mut *a).unwrap());
        rb.retain_mut(|r| !r.poll(&mut *b).unwrap());
    }
}

/// Registers `buf` with `t`.
pub(crate) fn reg<T: Transport + ?Sized>(t: &mut T, buf: &mut [u8]) -> MemHandle {
    // SAFETY: every test keeps the buffer alive and untouched until its
    // transfers are done, and drops the transports first.
    unsafe { t.register(buf.as_mut_ptr(), buf.len()) }.unwrap()
}

/// One message of each size (message k filled by `pattern(len, k)`)
/// registered with `a`, and a zeroed destination for each registered with
/// `b`: the vectors and their handles.
pub(crate) struct Messages {
    pub src: Vec<Vec<u8>>,
    pub dst: Vec<Vec<u8>>,
    pub ms: Vec<MemHandle>,
    pub md: Vec<MemHandle>,
}

impl Messages {
    pub fn new<T: Transport>(
        a: &mut T,
        b: &mut T,
        sizes: &[usize],
        pattern: fn(usize, u8) -> Vec<u8>,
    ) -> Messages {
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &len)| pattern(len, k as u8))
            .collect();
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|&len| vec![0u8; len]).collect();
        let ms = src.iter_mut().map(|v| reg(a, v)).collect();
        let md = dst.iter_mut().map(|v| reg(b, v)).collect();
        Messages { src, dst, ms, md }
    }
}
