//! A registration cache keyed by address range.
//!
//! Registering memory pins pages and programs the NIC, which costs far
//! more than a transfer of a few kilobytes, and gradwire sends from the
//! same gradient buffers every step. The cache hands back a registration
//! that already covers `[ptr, ptr+len)` with at least the access asked
//! for, and registers the range otherwise. It does not watch for unmaps:
//! whoever frees or remaps cached memory must call
//! [`RegCache::invalidate`] first. Entries are handed out as `Arc`s, so a
//! transfer still in flight keeps its registration alive after the entry
//! is invalidated.
//!
//! It is generic over the registration type so that its bookkeeping is
//! tested without a NIC; with [`Mr`] it registers through an endpoint.

use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::mr::Mr;
use std::collections::BTreeMap;
use std::sync::Arc;

struct Entry<M> {
    len: usize,
    access: u64,
    reg: Arc<M>,
}

/// Registrations by start address.
pub struct RegCache<M = Mr> {
    // Start address to entries starting there (ranges may overlap).
    by_start: BTreeMap<usize, Vec<Entry<M>>>,
    // The longest entry, to stop the search for a covering one early.
    max_len: usize,
    entries: usize,
    hits: u64,
    misses: u64,
}

impl<M> Default for RegCache<M> {
    fn default() -> Self {
        RegCache {
            by_start: BTreeMap::new(),
            max_len: 0,
            entries: 0,
            hits: 0,
            misses: 0,
        }
    }
}

impl<M> RegCache<M> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cached registration covering `[ptr, ptr+len)` with every bit of
    /// `access`, counted as a hit; `None` (not counted) when there is none.
    pub fn lookup(&mut self, ptr: *const u8, len: usize, access: u64) -> Option<Arc<M>> {
        let start = ptr as usize;
        let end = start.checked_add(len)?;
        for (&s, entries) in self.by_start.range(..=start).rev() {
            if s.saturating_add(self.max_len) < end {
                break; // nothing starting this early is long enough
            }
            for e in entries {
                if s + e.len >= end && e.access & access == access {
                    self.hits += 1;
                    return Some(e.reg.clone());
                }
            }
        }
        None
    }

    /// The cached registration covering the range, or a new one made by
    /// `register` (counted as a miss) and cached.
    pub fn get_or_insert_with<E>(
        &mut self,
        ptr: *const u8,
        len: usize,
        access: u64,
        register: impl FnOnce() -> std::result::Result<M, E>,
    ) -> std::result::Result<Arc<M>, E> {
        if let Some(r) = self.lookup(ptr, len, access) {
            return Ok(r);
        }
        let reg = Arc::new(register()?);
        self.misses += 1;
        self.entries += 1;
        self.max_len = self.max_len.max(len);
        self.by_start.entry(ptr as usize).or_default().push(Entry {
            len,
            access,
            reg: reg.clone(),
        });
        Ok(reg)
    }

    /// Drops every entry that overlaps `[ptr, ptr+len)`; returns how many.
    /// Call it before freeing or remapping memory that may be cached.
    pub fn invalidate(&mut self, ptr: *const u8, len: usize) -> usize {
        let start = ptr as usize;
        let end = start.saturating_add(len);
        let lo = start.saturating_sub(self.max_len);
        let mut removed = 0;
        let keys: Vec<usize> = self.by_start.range(lo..end).map(|(&k, _)| k).collect();
        for k in keys {
            if let Some(entries) = self.by_start.get_mut(&k) {
                let before = entries.len();
                entries.retain(|e| k + e.len <= start);
                removed += before - entries.len();
                if entries.is_empty() {
                    self.by_start.remove(&k);
                }
            }
        }
        self.entries -= removed;
        if self.entries == 0 {
            self.max_len = 0;
        }
        removed
    }

    /// Lookups answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Registrations made.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Entries cached.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

impl RegCache<Mr> {
    /// A registration covering `[ptr, ptr+len)` for `access`, cached or
    /// made through `ep`.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::register`]: the memory stays valid while any
    /// registration covering it is cached or held; call
    /// [`Self::invalidate`] before freeing it.
    pub unsafe fn register(
        &mut self,
        ep: &Endpoint,
        ptr: *const u8,
        len: usize,
        access: u64,
    ) -> Result<Arc<Mr>> {
        // SAFETY: the caller's promise is passed on.
        self.get_or_insert_with(ptr, len, access, || unsafe {
            ep.register(ptr, len, access)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn reg(
        cache: &mut RegCache<(usize, usize)>,
        start: usize,
        len: usize,
        access: u64,
        made: &Cell<u32>,
    ) -> (usize, usize) {
        *cache
            .get_or_insert_with(start as *const u8, len, access, || {
                made.set(made.get() + 1);
                Ok::<_, ()>((start, len))
            })
            .unwrap()
    }

    #[test]
    fn covered_ranges_hit_and_others_miss() {
        let made = Cell::new(0);
        let mut c = RegCache::new();
        assert_eq!(reg(&mut c, 0x1000, 0x1000, 3, &made), (0x1000, 0x1000));
        // Inside, at both edges, and the whole range: hits.
        assert_eq!(reg(&mut c, 0x1000, 1, 3, &made), (0x1000, 0x1000));
        assert_eq!(reg(&mut c, 0x1fff, 1, 1, &made), (0x1000, 0x1000));
        assert_eq!(reg(&mut c, 0x1800, 0x800, 2, &made), (0x1000, 0x1000));
        assert_eq!((c.hits(), c.misses(), made.get()), (3, 1, 1));
        // One byte past the end, or starting before: misses.
        assert_eq!(reg(&mut c, 0x1800, 0x801, 3, &made), (0x1800, 0x801));
        assert_eq!(reg(&mut c, 0xfff, 2, 3, &made), (0xfff, 2));
        // More access than cached: a miss.
        assert_eq!(reg(&mut c, 0x1000, 0x10, 4, &made), (0x1000, 0x10));
        assert_eq!((c.hits(), c.misses(), c.len()), (3, 4, 4));
        // A later, shorter entry does not hide an earlier long one.
        assert_eq!(reg(&mut c, 0x1c00, 0x10, 4, &made), (0x1c00, 0x10));
        assert_eq!(reg(&mut c, 0x1c20, 0x10, 1, &made), (0x1800, 0x801));
        assert_eq!((c.hits(), c.misses()), (4, 5));
    }

    #[test]
    fn invalidate_drops_overlapping_entries_only() {
        let made = Cell::new(0);
        let mut c = RegCache::new();
        reg(&mut c, 0x1000, 0x1000, 1, &made);
        reg(&mut c, 0x3000, 0x1000, 1, &made);
        reg(&mut c, 0x5000, 0x100, 1, &made);
        // Overlaps the tail of the first only.
        assert_eq!(c.invalidate(0x1fff as *const u8, 1), 1);
        assert_eq!(c.len(), 2);
        // Ends where the second starts: no overlap.
        assert_eq!(c.invalidate(0x2000 as *const u8, 0x1000), 0);
        assert_eq!(c.invalidate(0x2000 as *const u8, 0x3001), 2);
        assert!(c.is_empty());
        // Gone: registering again is a miss.
        reg(&mut c, 0x1000, 0x10, 1, &made);
        assert_eq!((c.misses(), made.get()), (4, 4));
    }

    #[test]
    fn a_held_registration_outlives_its_entry() {
        let mut c: RegCache<String> = RegCache::new();
        let r = c
            .get_or_insert_with(0x1000 as *const u8, 16, 1, || Ok::<_, ()>("mr".to_owned()))
            .unwrap();
        assert_eq!(c.invalidate(0x1000 as *const u8, 16), 1);
        assert_eq!(*r, "mr");
        assert_eq!(Arc::strong_count(&r), 1);
    }

    #[test]
    fn a_failed_registration_is_not_cached() {
        let mut c: RegCache<u32> = RegCache::new();
        assert!(
            c.get_or_insert_with(0x1000 as *const u8, 16, 1, || Err("refused"))
                .is_err()
        );
        assert!(c.is_empty());
        assert_eq!(c.misses(), 0);
    }
}
