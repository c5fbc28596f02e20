//! A stand-in vocabulary for the transport's own tests: the transport never
//! knows what an operation is, so its tests make signatures of their own
//! (an element count and a kind byte) and print them like a collective.

use crate::seam::{Scope, Signature, Tag};
use std::fmt;

fn count_of(t: &Tag) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&t.sig.0[..8]);
    u64::from_le_bytes(b)
}

/// Prints a test tag's operation.
pub(crate) fn show(t: &Tag, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "test_op(seq={}, count={}, kind={})",
        t.seq,
        count_of(t),
        t.sig.0[8]
    )
}

/// A signature of `count` elements of operation kind `kind`.
pub(crate) fn sig(count: u64, kind: u8) -> Signature {
    let mut s = Signature::default();
    s.0[..8].copy_from_slice(&count.to_le_bytes());
    s.0[8] = kind;
    s
}

/// A collective's message: operation slot `seq` of conversation `comm`.
pub(crate) fn tag(comm: u64, seq: u64, count: u64, kind: u8, step: u32) -> Tag {
    Tag {
        comm,
        seq,
        step,
        sig: sig(count, kind),
        scope: Scope::Operation,
        show,
    }
}
