//! A small cache of memory registrations keyed by address range.
//!
//! `ibv_reg_mr` pins pages and programs the device's translation tables: tens
//! of microseconds for a small buffer, milliseconds for a large one. A
//! training step hands gradwire the same buffers every step, so a
//! registration covering the range asked for is reused. This is the data
//! structure only, generic over what a registration is, so that it is
//! tested without a device: the backend keeps `MemoryRegion`s in it and
//! deregisters what [`RegCache::insert`] evicts and what
//! [`RegCache::invalidate`] removes (memory freed or unmapped must never
//! stay registered: its pages stay pinned, and a reused address would find
//! the old registration).
//!
//! Capacity is small (tens of entries), so lookups scan the entries that
//! start at or below the address; least recently used entries go first.

use std::collections::BTreeMap;

/// One cached registration of `[start, end)`.
#[derive(Debug)]
struct Slot<T> {
    value: T,
    last_use: u64,
}

/// Registrations of address ranges, at most `capacity` of them.
#[derive(Debug)]
pub struct RegCache<T> {
    /// Keyed by (start, end): ranges may overlap and share a start.
    slots: BTreeMap<(u64, u64), Slot<T>>,
    capacity: usize,
    clock: u64,
    hits: u64,
    misses: u64,
}

impl<T> RegCache<T> {
    /// A cache of at most `capacity` registrations (at least 1).
    pub fn new(capacity: usize) -> RegCache<T> {
        RegCache {
            slots: BTreeMap::new(),
            capacity: capacity.max(1),
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Lookups that found a registration, and those that did not.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// A registration covering all of `[addr, addr + len)`, marked used; the
    /// smallest such one where several do. `None` for a range that wraps the
    /// address space.
    pub fn lookup(&mut self, addr: u64, len: u64) -> Option<&T> {
        let Some(end) = addr.checked_add(len) else {
            self.misses += 1;
            return None;
        };
        let key = self
            .slots
            .range(..=(addr, u64::MAX))
            .filter(|((_, e), _)| *e >= end)
            .min_by_key(|((s, e), _)| e - s)
            .map(|(k, _)| *k);
        match key {
            Some(k) => {
                self.hits += 1;
                let now = self.tick();
                let slot = self.slots.get_mut(&k)?;
                slot.last_use = now;
                Some(&slot.value)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Caches `value` as the registration of `[addr, addr + len)` and
    /// returns the registrations it displaced, for the caller to
    /// deregister: one already cached for exactly this range, and the least
    /// recently used ones while the cache is over capacity. A range that
    /// wraps the address space is not cached and comes straight back.
    pub fn insert(&mut self, addr: u64, len: u64, value: T) -> Vec<T> {
        let Some(end) = addr.checked_add(len) else {
            return vec![value];
        };
        let now = self.tick();
        let mut out = Vec::new();
        if let Some(old) = self.slots.insert(
            (addr, end),
            Slot {
                value,
                last_use: now,
            },
        ) {
            out.push(old.value);
        }
        while self.slots.len() > self.capacity {
            let oldest = self
                .slots
                .iter()
                .min_by_key(|(_, s)| s.last_use)
                .map(|(k, _)| *k);
            match oldest.and_then(|k| self.slots.remove(&k)) {
                Some(s) => out.push(s.value),
                None => break,
            }
        }
        out
    }

    /// Removes and returns every registration that overlaps `[addr, addr +
    /// len)`: that memory is being freed or remapped.
    pub fn invalidate(&mut self, addr: u64, len: u64) -> Vec<T> {
        let end = addr.saturating_add(len);
        let doomed: Vec<(u64, u64)> = self
            .slots
            .range(..(end, 0))
            .filter(|((s, e), _)| *s < end && *e > addr)
            .map(|(k, _)| *k)
            .collect();
        doomed
            .into_iter()
            .filter_map(|k| self.slots.remove(&k).map(|s| s.value))
            .collect()
    }

    /// Removes and returns every registration (at shutdown).
    pub fn drain(&mut self) -> Vec<T> {
        std::mem::take(&mut self.slots)
            .into_values()
            .map(|s| s.value)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_a_covering_registration() {
        let mut c = RegCache::new(8);
        assert!(c.insert(0x1000, 0x1000, "a").is_empty());
        assert_eq!(c.lookup(0x1000, 0x1000), Some(&"a"));
        assert_eq!(c.lookup(0x1800, 0x10), Some(&"a"));
        assert_eq!(c.lookup(0x1fff, 1), Some(&"a"));
        assert_eq!(c.lookup(0x2000, 0), Some(&"a"));
        assert_eq!(c.lookup(0x1fff, 2), None);
        assert_eq!(c.lookup(0xfff, 2), None);
        assert_eq!(c.lookup(0x3000, 1), None);
        assert_eq!(c.stats(), (4, 3));
    }

    #[test]
    fn an_earlier_longer_range_covers_a_later_start() {
        let mut c = RegCache::new(8);
        c.insert(0x0, 0x10000, "big");
        c.insert(0x4000, 0x100, "small");
        // The entry starting nearest below does not cover; the big one does.
        assert_eq!(c.lookup(0x4080, 0x1000), Some(&"big"));
        // Where both cover, the smaller wins.
        assert_eq!(c.lookup(0x4000, 0x10), Some(&"small"));
    }

    #[test]
    fn the_same_range_replaces_and_returns_the_old() {
        let mut c = RegCache::new(8);
        c.insert(0x1000, 0x1000, 1);
        assert_eq!(c.insert(0x1000, 0x1000, 2), vec![1]);
        assert_eq!(c.len(), 1);
        assert_eq!(c.lookup(0x1000, 1), Some(&2));
        // Same start, other length: both are kept.
        assert!(c.insert(0x1000, 0x2000, 3).is_empty());
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = RegCache::new(2);
        c.insert(0x1000, 0x100, "a");
        c.insert(0x2000, 0x100, "b");
        assert_eq!(c.lookup(0x1000, 1), Some(&"a"));
        assert_eq!(c.insert(0x3000, 0x100, "c"), vec!["b"]);
        assert_eq!(c.lookup(0x2000, 1), None);
        assert_eq!(c.lookup(0x1000, 1), Some(&"a"));
        assert_eq!(c.lookup(0x3000, 1), Some(&"c"));
        assert_eq!(c.len(), 2);
        assert_eq!(c.capacity(), 2);
        assert_eq!(RegCache::<u8>::new(0).capacity(), 1);
    }

    #[test]
    fn invalidate_removes_every_overlap() {
        let mut c = RegCache::new(8);
        c.insert(0x0, 0x1000, "below");
        c.insert(0x1000, 0x1000, "inside");
        c.insert(0x1800, 0x1000, "straddles");
        c.insert(0x0, 0x10000, "around");
        c.insert(0x2000, 0x1000, "after");
        let mut gone = c.invalidate(0x1000, 0x1000);
        gone.sort();
        assert_eq!(gone, vec!["around", "inside", "straddles"]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.lookup(0x0, 0x1000), Some(&"below"));
        assert_eq!(c.lookup(0x2000, 0x1000), Some(&"after"));
        assert!(c.invalidate(0x1000, 0x1000).is_empty());
        let mut rest = c.drain();
        rest.sort();
        assert_eq!(rest, vec!["after", "below"]);
        assert!(c.is_empty());
    }

    #[test]
    fn wrapping_ranges_are_refused() {
        let mut c = RegCache::new(4);
        assert_eq!(c.insert(u64::MAX, 2, 7), vec![7]);
        assert!(c.is_empty());
        c.insert(u64::MAX - 10, 10, 8);
        assert_eq!(c.lookup(u64::MAX - 1, 5), None);
        assert_eq!(c.lookup(u64::MAX - 1, 1), Some(&8));
        assert_eq!(c.invalidate(u64::MAX - 1, 100), vec![8]);
    }

    proptest! {
        /// Against a model: a lookup finds something exactly when some cached
        /// range covers the query, and what it finds covers it; the cache
        /// never holds more than its capacity, and nothing is lost (every
        /// value inserted is either cached or was handed back).
        #[test]
        fn agrees_with_a_model(ops in proptest::collection::vec((0u8..3, 0u64..64, 0u64..32), 1..200)) {
            let mut c = RegCache::new(5);
            let mut model: Vec<(u64, u64, usize)> = Vec::new();
            let mut handed_back = 0usize;
            let mut inserted = 0usize;
            for (i, (op, a, l)) in ops.into_iter().enumerate() {
                let (addr, len) = (a * 16, l * 16);
                match op {
                    0 => {
                        inserted += 1;
                        let out = c.insert(addr, len, (addr, addr + len, i));
                        handed_back += out.len();
                        model.retain(|m| !out.contains(m));
                        model.retain(|&(s, e, _)| (s, e) != (addr, addr + len));
                        model.push((addr, addr + len, i));
                    }
                    1 => {
                        let found = c.lookup(addr, len).copied();
                        let covered = model.iter().any(|&(s, e, _)| s <= addr && e >= addr + len);
                        prop_assert_eq!(found.is_some(), covered);
                        if let Some((s, e, _)) = found {
                            prop_assert!(s <= addr && e >= addr + len);
                        }
                    }
                    _ => {
                        let out = c.invalidate(addr, len);
                        handed_back += out.len();
                        for &(s, e, _) in &out {
                            prop_assert!(s < addr + len && e > addr);
                        }
                        model.retain(|m| !out.contains(m));
                        prop_assert!(!model.iter().any(|&(s, e, _)| s < addr + len && e > addr));
                    }
                }
                prop_assert!(c.len() <= 5);
                prop_assert_eq!(c.len(), model.len());
            }
            prop_assert_eq!(inserted, handed_back + c.len());
        }
    }
}
