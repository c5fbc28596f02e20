//! The table of outstanding requests each transport keeps, keyed by request
//! number.
//!
//! Request numbers are handed out by the transport itself, one after the
//! other, so they need no protection against chosen collisions; the default
//! SipHash cost more than a small shared-memory step's transfer (a profile
//! of 8-byte all-reduces put 9% of all cycles in hashing them).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a request number with one multiplication (Fibonacci hashing).
#[derive(Default, Clone, Copy)]
pub(crate) struct ReqHasher(u64);

impl Hasher for ReqHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed here; anything else still hashes, slowly.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Outstanding requests by number.
pub(crate) type ReqMap<V> = HashMap<u64, V, BuildHasherDefault<ReqHasher>>;

/// An empty table with room for `n` requests.
pub(crate) fn with_capacity<V>(n: usize) -> ReqMap<V> {
    HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_numbers_stay_distinct_and_findable() {
        let mut m = with_capacity(4);
        for i in 0..10_000u64 {
            m.insert(i, i * 2);
        }
        for i in 0..10_000u64 {
            assert_eq!(m.remove(&i), Some(i * 2));
        }
        assert!(m.is_empty());
    }
}

/// A table of requests by number, with what the transport keeps for each
/// (`V`), which counts the requests it marks done: the count is what a
/// transport reports as `Transport::finished`. A request becomes done only
/// through [`ReqTable::finish`], so one finishing anywhere moves the count.
#[derive(Debug)]
pub(crate) struct ReqTable<V> {
    map: ReqMap<V>,
    finished: u64,
}

impl<V> ReqTable<V> {
    /// An empty table with room for `n` requests.
    pub fn with_capacity(n: usize) -> ReqTable<V> {
        ReqTable {
            map: with_capacity(n),
            finished: 0,
        }
    }

    /// Request `req` is posted and pending, in state `v`.
    pub fn post(&mut self, req: u64, v: V) {
        self.map.insert(req, v);
    }

    /// Request `req` is done, in state `v` (and counted).
    pub fn finish(&mut self, req: u64, v: V) {
        self.map.insert(req, v);
        self.finished += 1;
    }

    /// The state of `req`; `None` if it is not in the table.
    pub fn get(&self, req: &u64) -> Option<&V> {
        self.map.get(req)
    }

    /// The state of `req` to change, short of finishing it.
    pub fn get_mut(&mut self, req: &u64) -> Option<&mut V> {
        self.map.get_mut(req)
    }

    /// Forgets `req` (tested done, or abandoned).
    pub fn remove(&mut self, req: &u64) -> Option<V> {
        self.map.remove(req)
    }

    /// Requests marked done since the table was made.
    pub fn finished(&self) -> u64 {
        self.finished
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
