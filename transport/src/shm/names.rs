//! Names of a job's shared segments and doorbells that nobody outside the
//! job can guess.
//!
//! Every local user can list `/dev/shm`, create files in it, and read every
//! bound abstract socket name from `/proc/net/unix`. A name built from the job
//! id (which is no secret) lets another user take it first: a file created
//! at a segment's name, or a socket bound at a doorbell's, breaks the job.
//! So each name is a one-way hash (SHA-256, 128 bits kept) of a secret that
//! rank 0 draws from the kernel and hands to the other ranks through the
//! authenticated store, of what the name is for, and of the ranks. Ranks
//! connect lazily, so names appear one at a time: because the hash is one
//! way, the names already in use reveal neither the secret nor a name still
//! to come.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// Shortest name secret accepted: 128 bits as hex.
pub(crate) const MIN_SECRET: usize = 32;
/// Longest name secret accepted.
pub(crate) const MAX_SECRET: usize = 128;
/// Hash bytes kept in a name: as many as the shortest secret has bits of.
const NAME_BYTES: usize = 16;

/// Checks that `secret` looks drawn from a random source: hex, long enough.
pub(crate) fn validate_secret(secret: &str) -> Result<()> {
    if !(MIN_SECRET..=MAX_SECRET).contains(&secret.len())
        || !secret.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(Error::InvalidArgument(format!(
            "shm name secret must be {MIN_SECRET} to {MAX_SECRET} hex digits drawn from a random \
             source (gw_rendezvous::token::random_hex(16)), got {} characters",
            secret.len()
        )));
    }
    Ok(())
}

/// The file name (in `/dev/shm`) of the segment of ranks `lo < hi`.
pub(crate) fn segment_name(secret: &str, lo: u32, hi: u32) -> String {
    name(secret, b"segment", &[lo, hi])
}

/// The abstract socket name of `rank`'s doorbell.
pub(crate) fn doorbell_name(secret: &str, rank: u32) -> String {
    name(secret, b"doorbell", &[rank])
}

/// The file name (in `/dev/shm`) of the host region keyed `key` (see
/// `host_region.rs`).
pub(crate) fn host_region_name(secret: &str, key: u64) -> String {
    name(secret, b"host-region", &[key as u32, (key >> 32) as u32])
}

fn name(secret: &str, what: &[u8], ranks: &[u32]) -> String {
    let mut h = Sha256::new();
    // Fixed-width fields after a length-prefixed secret: no two inputs read
    // the same, so no two names collide but by chance.
    h.update(b"gradwire shm name v1\0");
    h.update((secret.len() as u64).to_le_bytes());
    h.update(secret.as_bytes());
    h.update(what);
    for r in ranks {
        h.update(r.to_le_bytes());
    }
    let digest = h.finalize();
    let mut s = String::with_capacity(3 + 2 * NAME_BYTES);
    s.push_str("gw-");
    for b in &digest[..NAME_BYTES] {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn names_are_stable_distinct_and_hide_the_secret() {
        // Every rank derives the same name from the same secret.
        assert_eq!(segment_name(S, 0, 1), segment_name(S, 0, 1));
        assert_eq!(doorbell_name(S, 3), doorbell_name(S, 3));
        let names = [
            segment_name(S, 0, 1),
            segment_name(S, 0, 2),
            segment_name(S, 1, 2),
            doorbell_name(S, 0),
            doorbell_name(S, 1),
            segment_name("f0112233445566778899aabbccddeeff", 0, 1),
        ];
        for (i, a) in names.iter().enumerate() {
            assert_eq!(a.len(), 3 + 32, "{a}");
            assert!(a.starts_with("gw-"), "{a}");
            assert!(
                !a.contains(S) && !a.contains(&S[..8]),
                "{a} shows the secret"
            );
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn secrets_must_look_random() {
        validate_secret(S).unwrap();
        validate_secret(&"a".repeat(MAX_SECRET)).unwrap();
        for bad in ["", "abc", &"g".repeat(32), &"a".repeat(MAX_SECRET + 1)] {
            let e = validate_secret(bad).unwrap_err().to_string();
            assert!(e.contains("hex digits"), "{e}");
        }
    }
}
