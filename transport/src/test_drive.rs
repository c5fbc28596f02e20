//! Driving two transports of one process by hand until their requests are
//! done: what every backend's tests do between posting and checking.

use crate::seam::{Outstanding, Transport};
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
