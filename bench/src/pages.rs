//! Benchmark buffers on transparent huge pages (`--hugepages 1`).
//!
//! Single-copy transfers between processes (`process_vm_writev`/`readv`,
//! which gradwire's shm transport and libfabric's shm provider use for large
//! messages) pin and map the other process's memory page by page. On 4 KiB
//! pages that costs a quarter to a half of memcpy's speed here; on 2 MiB
//! pages the same copy runs at 0.8–1.0 of memcpy, while memcpy itself does
//! not change. perftest offers the choice (`--use_hugepages`), and numpy
//! already advises huge pages for its large arrays, so a user's buffers may
//! be of either kind: gwbench measures both, and says which it used and what
//! the kernel actually gave.

use crate::check::Value;
use serde::Serialize;
use std::alloc::{Layout, alloc, dealloc};
use std::fs;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The size and alignment of a huge page on x86-64 and aarch64 (4 KiB
/// granule): whole ones are what the kernel can back with a huge page.
const HUGE: usize = 2 << 20;

/// A benchmark buffer of `len` zeroed elements, faulted in before timing.
/// On huge pages it is allocated in whole, aligned 2 MiB units, so that
/// even a 1 MiB buffer can sit on one: `malloc`'s large blocks start 16
/// bytes past a page, which leaves the first and last partial units (all of
/// a buffer under 4 MiB) on small pages.
pub struct Buffer<T> {
    ptr: NonNull<T>,
    len: usize,
    layout: Option<Layout>,
}

impl<T: Value> Buffer<T> {
    /// `len` elements whose bytes are all zero, on huge pages if `huge`.
    /// All-zero bytes are the zero of every [`Value`] type (integers and
    /// IEEE floats), which is why the bound is `Value` and not `Copy`.
    pub fn zeroed(len: usize, huge: bool) -> Result<Buffer<T>, String> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| format!("{len} elements overflow the address space"))?;
        if bytes == 0 {
            return Ok(Buffer {
                ptr: NonNull::dangling(),
                len,
                layout: None,
            });
        }
        let layout = if huge {
            let whole = bytes
                .checked_next_multiple_of(HUGE)
                .ok_or_else(|| format!("{bytes} bytes overflow whole huge pages"))?;
            Layout::from_size_align(whole, HUGE)
        } else {
            Layout::from_size_align(bytes, align_of::<T>())
        }
        .map_err(|e| format!("{bytes} bytes: {e}"))?;
        // SAFETY: the layout's size is not zero.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<T>()) else {
            return Err(format!("out of memory for {} bytes", layout.size()));
        };
        let buf = Buffer {
            ptr,
            len,
            layout: Some(layout),
        };
        if huge {
            advise_huge(raw, layout.size())?;
        }
        // SAFETY: `raw` is valid for `layout.size()` bytes. Writing every
        // byte also faults the pages in (on huge pages, after the advice).
        unsafe { raw.write_bytes(0, layout.size()) };
        Ok(buf)
    }
}

impl<T> Buffer<T> {
    /// Where its bytes start and how many there are, for [`Given::of`].
    pub fn span(&self) -> (*const u8, usize) {
        (self.ptr.as_ptr().cast(), self.len * size_of::<T>())
    }
}

impl<T> Drop for Buffer<T> {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

impl<T> Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements (zeroed), or dangling and empty.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// What `--hugepages 1` got, for the header: rank 0's buffers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Given {
    /// Bytes of the buffers on huge pages after they were faulted in, at
    /// most ([`huge_bytes`]); `None` if `/proc/self/smaps` could not say.
    pub huge_bytes: Option<u64>,
    /// The buffers' bytes.
    pub bytes: u64,
    /// The kernel's policy ([`policy`]).
    pub policy: String,
    /// Why the huge page count is unknown, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

impl Given {
    /// Reads what the kernel gave `buffers` (each a start and a length).
    pub fn of(buffers: &[(*const u8, usize)]) -> Given {
        let got = huge_bytes(buffers);
        Given {
            huge_bytes: got.as_ref().ok().copied(),
            bytes: buffers.iter().map(|&(_, n)| n as u64).sum(),
            policy: policy(),
            unknown: got.err(),
        }
    }

    /// The header line.
    pub fn line(&self) -> String {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let on = match (self.huge_bytes, &self.unknown) {
            (Some(h), _) => format!(
                "at most {:.1} of {:.1} MiB on them",
                mib(h),
                mib(self.bytes)
            ),
            (None, why) => format!(
                "how much of {:.1} MiB is on them is unknown ({})",
                mib(self.bytes),
                why.as_deref().unwrap_or("?")
            ),
        };
        format!(
            "# Buffers: transparent huge pages asked for; {on} (rank 0; kernel: {})",
            self.policy
        )
    }
}

/// The kernel's transparent huge page policy, as
/// `/sys/kernel/mm/transparent_hugepage/enabled` shows it (the bracketed
/// word is in force), or why it could not be read.
pub fn policy() -> String {
    fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// Asks the kernel to back `[ptr, ptr + len)`, a range of whole pages
/// (here whole, aligned huge pages: see [`Buffer`]), with huge pages from
/// its next faults on.
fn advise_huge(ptr: *mut u8, len: usize) -> Result<(), String> {
    // SAFETY: madvise with MADV_HUGEPAGE changes no contents and no
    // protection; the range is memory this process allocated.
    let rc = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        return Err(format!(
            "madvise(MADV_HUGEPAGE) on {len} bytes failed: {} (transparent huge pages: {})",
            std::io::Error::last_os_error(),
            policy()
        ));
    }
    Ok(())
}

/// How many bytes of `buffers` (each a start and a length; they do not
/// overlap) sit on huge pages now, at most, from `/proc/self/smaps`: a
/// mapping's `AnonHugePages`, capped by how much of the buffers it holds.
/// Adjacent buffers may share a mapping, and a mapping may hold huge
/// pages outside them; smaps does not say where in a mapping its huge
/// pages are, so the figure is an upper bound.
pub fn huge_bytes(buffers: &[(*const u8, usize)]) -> Result<u64, String> {
    let smaps = fs::read_to_string("/proc/self/smaps")
        .map_err(|e| format!("cannot read /proc/self/smaps: {e}"))?;
    let ranges: Vec<(u64, u64)> = buffers
        .iter()
        .map(|&(p, n)| (p as u64, p as u64 + n as u64))
        .collect();
    Ok(huge_in(&smaps, &ranges))
}

/// [`huge_bytes`] over the text of an smaps file and `[lo, hi)` ranges.
fn huge_in(smaps: &str, ranges: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    let mut held = 0u64;
    for line in smaps.lines() {
        if let Some(kb) = line.strip_prefix("AnonHugePages:") {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            total += kb.saturating_mul(1024).min(held);
            continue;
        }
        // A mapping's first line: "start-end perms offset dev inode path".
        let Some((range, _)) = line.split_once(' ') else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
            held = ranges
                .iter()
                .map(|&(lo, hi)| hi.min(b).saturating_sub(lo.max(a)))
                .sum();
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_huge_pages_count_only_inside_the_range() {
        let smaps = "\
7f0000000000-7f0000800000 rw-p 00000000 00:00 0 \n\
Size:               8192 kB\n\
AnonHugePages:      6144 kB\n\
7f0000800000-7f0000a00000 rw-p 00000000 00:00 0 \n\
AnonHugePages:      2048 kB\n\
7f0001000000-7f0001200000 rw-p 00000000 00:00 0 [heap]\n\
AnonHugePages:      2048 kB\n";
        let mib = 1 << 20;
        let base = 0x7f00_0000_0000u64;
        // The whole first mapping: its 6 MiB.
        assert_eq!(huge_in(smaps, &[(base, base + 8 * mib)]), 6 * mib);
        // 1 MiB of it: no more than the overlap.
        assert_eq!(huge_in(smaps, &[(base, base + mib)]), mib);
        // Both adjacent mappings, not the far one.
        assert_eq!(huge_in(smaps, &[(base, base + 10 * mib)]), 8 * mib);
        assert_eq!(huge_in(smaps, &[(base + 10 * mib, base + 16 * mib)]), 0);
        // Two buffers in one mapping: its huge pages counted once.
        let two = [(base, base + 3 * mib), (base + 3 * mib, base + 8 * mib)];
        assert_eq!(huge_in(smaps, &two), 6 * mib);
        let apart = [(base, base + mib), (base + 4 * mib, base + 5 * mib)];
        assert_eq!(huge_in(smaps, &apart), 2 * mib);
    }

    #[test]
    fn buffers_are_zeroed_aligned_and_writable() {
        for (len, huge) in [
            (0, false),
            (0, true),
            (3, false),
            (3, true),
            (1 << 19, true),
        ] {
            let mut b = Buffer::<f32>::zeroed(len, huge).expect("allocate");
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0.0));
            if huge && len > 0 {
                assert_eq!(b.as_ptr() as usize % HUGE, 0);
            }
            for (i, x) in b.iter_mut().enumerate() {
                *x = i as f32;
            }
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as f32));
        }
        assert!(Buffer::<i64>::zeroed(usize::MAX / 4, false).is_err());
        // Rounding up to whole huge pages must not wrap to a tiny block.
        assert!(Buffer::<u8>::zeroed(usize::MAX, true).is_err());
        assert!(Buffer::<u8>::zeroed(usize::MAX - 4096, true).is_err());
    }

    #[test]
    fn advised_memory_gets_huge_pages_where_the_kernel_allows() {
        // 2 MiB: one aligned huge page's worth, the smallest that can get one.
        let len = 2 << 20;
        // Up to three buffers, all kept: memory too fragmented for one huge
        // page right now is not what is tested.
        let fallbacks = || {
            fs::read_to_string("/proc/vmstat")
                .ok()
                .and_then(|v| {
                    v.lines()
                        .find_map(|l| l.strip_prefix("thp_fault_fallback "))
                        .and_then(|n| n.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        let fell_back_before = fallbacks();
        let mut kept = Vec::new();
        let mut got = 0;
        for _ in 0..3 {
            let b = Buffer::<u8>::zeroed(len, true).expect("allocate");
            got = huge_bytes(&[(b.as_ptr(), len)]).expect("smaps");
            kept.push(b);
            if got == len as u64 {
                break;
            }
        }
        let policy = policy();
        let thp = "/sys/kernel/mm/transparent_hugepage";
        let defrag = fs::read_to_string(format!("{thp}/defrag")).unwrap_or_default();
        // The 2 MiB size's own switch (newer kernels): "inherit" follows
        // the policy above.
        let size = fs::read_to_string(format!("{thp}/hugepages-2048kB/enabled"))
            .unwrap_or_else(|_| "[inherit]".into());
        // With huge pages allowed for advised memory and the kernel told to
        // compact for it at fault time, the buffer is one.
        let allowed = (policy.contains("[always]") || policy.contains("[madvise]"))
            && !size.contains("[never]");
        let compacts = ["[always]", "[madvise]", "[defer+madvise]"]
            .iter()
            .any(|w| defrag.contains(w));
        // The kernel counts a huge page it tried for and could not get
        // (fragmented memory, a cgroup's limit): no fault of the advice.
        let kernel_fell_back = fallbacks() > fell_back_before;
        if allowed && compacts && !(got < len as u64 && kernel_fell_back) {
            assert_eq!(got, len as u64, "bytes on huge pages ({policy}; {defrag})");
        } else {
            eprintln!(
                "not checked: no huge page on advice here ({policy}; {defrag}; \
                 the kernel fell back: {kernel_fell_back})"
            );
        }
    }
}
