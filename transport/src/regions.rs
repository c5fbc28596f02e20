//! The table of registered regions a backend keeps behind its memory
//! handles: a handle's index is a slot here, slots freed by `deregister`
//! are reused, and an index that names no region is an error that says
//! which call was given it.
//!
//! Every backend that registers memory (shm, ofi) needs the same table and
//! the same errors, and the same bounds check of a transfer's range.

use crate::error::{Error, Result};

/// A registered region's place in memory, as the range check needs it.
pub(crate) trait Extent {
    fn base(&self) -> *mut u8;
    fn len(&self) -> usize;
}

#[derive(Debug)]
pub(crate) struct Regions<R> {
    slots: Vec<Option<R>>,
}

impl<R: Extent> Regions<R> {
    pub fn new() -> Regions<R> {
        Regions { slots: Vec::new() }
    }

    /// Stores `r` in the first free slot; returns its index.
    pub fn insert(&mut self, r: R) -> Result<u32> {
        let i = match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => {
                self.slots[i] = Some(r);
                i
            }
            None => {
                self.slots.push(Some(r));
                self.slots.len() - 1
            }
        };
        u32::try_from(i).map_err(|_| Error::InvalidUsage("too many registered regions".into()))
    }

    /// The region of `index`, for call `what`.
    pub fn get(&self, index: u32, what: &str) -> Result<&R> {
        self.slots
            .get(index as usize)
            .and_then(|s| s.as_ref())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{what}: memory handle {index} is not registered"))
            })
    }

    /// Frees the slot of `index` (checked with [`Regions::get`] first).
    pub fn remove(&mut self, index: u32) {
        if let Some(s) = self.slots.get_mut(index as usize) {
            *s = None;
        }
    }

    /// The start of `[offset, offset + len)` of region `index`, and the
    /// region, after checking the range lies inside it.
    pub fn range(
        &self,
        index: u32,
        offset: usize,
        len: usize,
        what: &str,
    ) -> Result<(*mut u8, &R)> {
        let r = self.get(index, what)?;
        if offset.checked_add(len).is_none_or(|end| end > r.len()) {
            return Err(Error::InvalidArgument(format!(
                "{what}: range [{offset}, {offset}+{len}) lies outside registered region {index} of {} bytes",
                r.len()
            )));
        }
        Ok((r.base().wrapping_add(offset), r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct R(usize);

    impl Extent for R {
        fn base(&self) -> *mut u8 {
            std::ptr::null_mut::<u8>().wrapping_add(0x1000)
        }
        fn len(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn slots_are_reused_and_unknown_or_outside_ranges_are_refused() {
        let mut t = Regions::new();
        assert_eq!(t.insert(R(10)).unwrap(), 0);
        assert_eq!(t.insert(R(20)).unwrap(), 1);
        t.remove(0);
        let e = t.get(0, "isend").unwrap_err().to_string();
        assert!(
            e.contains("isend: memory handle 0 is not registered"),
            "{e}"
        );
        assert_eq!(t.insert(R(30)).unwrap(), 0, "the freed slot is reused");
        let (p, r) = t.range(1, 5, 15, "irecv").unwrap();
        assert_eq!((p as usize, r.len()), (0x1005, 20));
        let e = t.range(1, 5, 16, "irecv").unwrap_err().to_string();
        assert!(e.contains("outside registered region 1 of 20 bytes"), "{e}");
        assert!(t.range(1, usize::MAX, 1, "irecv").is_err());
        assert!(t.get(7, "x").is_err());
    }
}
