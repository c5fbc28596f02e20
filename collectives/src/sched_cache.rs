//! The engine's schedule cache: a training step repeats the same collectives
//! with the same shapes, so the engine keeps the schedules of recent calls and
//! rewinds one ([`Schedule::reset`]) instead of building it again. Building
//! allocates (every action, edge and successor list), and a steady-state step
//! must not (design principle 3); rewinding only rewrites vectors in place.
//!
//! The key is everything a schedule is built from: the [`OpSpec`] (operation,
//! rank, world size, count, root, segment size, pipeline depth, weighting,
//! host layout, fan-out) and the algorithm.
//! Buffers, dtype and reduction operator are not part of it: schedules speak
//! in elements of three abstract buffers, and the engine binds them per call.
//!
//! Memory stays bounded two ways. At most [`MAX_ENTRIES`] schedules are kept
//! (a step has a handful of distinct shapes: gradient buckets, a barrier, a
//! broadcast; a few dozen leave room for several models or phases), and the
//! least recently used one goes first. And their total size is capped at
//! [`MAX_BYTES`]: a schedule is about 100 bytes per action, so the cap holds
//! hundreds of thousands of actions (a 1 GiB all-reduce at the default 512 KiB
//! segments on 64 ranks has tens of thousands). A schedule bigger than the
//! whole cap (millions of tiny segments) is not kept at all: its operation
//! moves so many messages that rebuilding it costs little beside running it,
//! while keeping it would pin its memory for the communicator's lifetime.
//!
//! The engine runs one operation at a time, so one schedule per key suffices:
//! it is taken out while its operation runs and put back when it finishes.

use crate::algo::{self, Algo, OpSpec, Schedule};
use gw_transport::Result;

/// Schedules kept at most.
pub(crate) const MAX_ENTRIES: usize = 32;
/// Total [`Schedule::heap_bytes`] kept at most.
pub(crate) const MAX_BYTES: usize = 64 << 20;

/// What a collective's schedule is built from.
pub(crate) type Key = (OpSpec, Algo);

struct Entry {
    key: Key,
    sched: Box<dyn Schedule>,
    bytes: usize,
    /// Value of the cache's clock when last put back (LRU order).
    used: u64,
}

pub(crate) struct ScheduleCache {
    /// Reserved up front, so that putting a schedule back never allocates.
    entries: Vec<Entry>,
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    clock: u64,
}

impl ScheduleCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> ScheduleCache {
        ScheduleCache {
            entries: Vec::with_capacity(max_entries),
            max_entries,
            max_bytes,
            bytes: 0,
            clock: 0,
        }
    }

    /// A schedule for `key` in its initial state: the cached one rewound, or
    /// a new one. The caller gives it back with [`ScheduleCache::put`].
    /// Lookup is a linear scan, which over a few dozen entries costs less
    /// than hashing an `OpSpec`.
    pub fn take(&mut self, key: &Key) -> Result<Box<dyn Schedule>> {
        if let Some(i) = self.entries.iter().position(|e| e.key == *key) {
            let e = self.entries.swap_remove(i);
            self.bytes -= e.bytes;
            let mut sched = e.sched;
            if sched.reset() {
                return Ok(sched);
            }
        }
        let sched = algo::build(&key.0, key.1)?;
        let s = &key.0;
        tracing::debug!(
            "{} for {} of {} elements on {} ranks, segment_elems {}",
            sched.name(),
            s.op.name(),
            s.count,
            s.nranks,
            s.segment_elems
        );
        Ok(sched)
    }

    /// Keeps a finished schedule for the next call with the same `key`,
    /// evicting the least recently used ones to stay within the bounds.
    pub fn put(&mut self, key: Key, sched: Box<dyn Schedule>) {
        let bytes = sched.heap_bytes();
        if self.max_entries == 0 || bytes > self.max_bytes {
            return;
        }
        while self.entries.len() >= self.max_entries || self.bytes + bytes > self.max_bytes {
            let Some(lru) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else {
                break;
            };
            let e = self.entries.swap_remove(lru);
            self.bytes -= e.bytes;
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.push(Entry {
            key,
            sched,
            bytes,
            used: self.clock,
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;

    fn spec(count: usize) -> OpSpec {
        OpSpec {
            op: OpKind::AllReduce,
            rank: 0,
            nranks: 4,
            count,
            root: 0,
            segment_elems: 16,
            depth: 8,
            scaled: false,
            local_size: 0,
            fan_out: false,
        }
    }

    /// Runs a schedule to the end completing every action at once, and
    /// returns the order of the actions it handed out.
    fn drive(s: &mut dyn Schedule) -> Vec<usize> {
        let mut order = Vec::new();
        while let Some(a) = s.next_action() {
            order.push(a.id());
            s.complete(a.id());
        }
        assert!(s.is_done());
        order
    }

    #[test]
    fn a_rewound_schedule_runs_exactly_as_a_new_one() {
        let mut cache = ScheduleCache::new(4, MAX_BYTES);
        for algo in [Algo::Ring, Algo::Tree, Algo::Rhd, Algo::Rd] {
            let key = (spec(1000), algo);
            let mut fresh = algo::build(&key.0, algo).expect("build");
            let want = drive(fresh.as_mut());
            cache.put(key, fresh);
            for _ in 0..3 {
                let mut s = cache.take(&key).expect("take");
                assert_eq!(drive(s.as_mut()), want, "{algo:?}");
                cache.put(key, s);
            }
        }
    }

    #[test]
    fn least_recently_used_goes_first_and_bounds_hold() {
        let mut cache = ScheduleCache::new(2, MAX_BYTES);
        for c in [10, 20, 30] {
            let key = (spec(c), Algo::Ring);
            let s = cache.take(&key).expect("take");
            cache.put(key, s);
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.entries.iter().all(|e| e.key.0.count != 10));
        // A schedule bigger than the byte cap is never kept.
        let mut tiny = ScheduleCache::new(8, 64);
        let key = (spec(1000), Algo::Ring);
        let s = tiny.take(&key).expect("take");
        assert!(s.heap_bytes() > 64);
        tiny.put(key, s);
        assert_eq!(tiny.len(), 0);
    }
}
