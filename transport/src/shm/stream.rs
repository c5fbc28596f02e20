//! Copies that go around the cache, for payloads bound for large buffers.
//!
//! A copy out of a ring slot into a buffer much larger than the last-level
//! cache (a big all-reduce's result) writes memory that will not be read
//! again soon; ordinary stores first read every destination line into the
//! cache and later write it back. Streaming stores skip that read: on this
//! project's VM a 128 KiB slot-to-buffer copy ran at 8-19 GB/s against
//! 4-9 GB/s for `memcpy` (interleaved, same run). Only SSE2 is used, which
//! every x86_64 CPU has; elsewhere this is a plain copy.

/// Receives into a registered region at least this large stream their
/// payloads (half this machine class's 32 MiB last-level cache: below it,
/// the data may well be read again from cache). Not read from the CPU: a
/// guest that reported a 480 MiB L3 still ran 64 and 256 MiB all-reduces
/// about 10% faster streaming (docs/performance.md, "What is left").
pub(crate) const STREAM_REGION_BYTES: usize = 16 << 20;

/// Copies below this size gain nothing from streaming.
const STREAM_MIN: usize = 4096;

/// Copies `len` bytes from `src` to `dst` with streaming stores where it
/// pays, and orders them before any later store (so that a completion
/// published afterwards is seen after the data).
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two
/// ranges must not overlap.
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_MIN {
        // SAFETY: forwarded from the caller.
        unsafe { copy_sse2(dst, src, len) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { super::near::copy(dst, src, len) };
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::_mm_sfence;
    // Plain copy up to the first 16-byte-aligned destination address.
    let head = dst.align_offset(16).min(len);
    // SAFETY: head <= len, within both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    // SAFETY: the rest of both ranges; the destination is 16-byte aligned
    // from `head` on, as streaming stores require.
    let i = head
        + unsafe { super::near::copy_blocks::<true>(dst.add(head), src.add(head), len - head) };
    // SAFETY: the tail lies within both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
    // SAFETY: SSE2 is part of x86_64.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every length and both misalignments copy exactly, and nothing
        /// around the destination range is touched.
        #[test]
        fn copies_exactly(len in 0usize..20_000, so in 0usize..16, d_off in 0usize..16) {
            let src: Vec<u8> = (0..len + so).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0xAAu8; len + d_off + 32];
            // SAFETY: both ranges lie within their vectors and do not overlap.
            unsafe { copy_streaming(dst.as_mut_ptr().add(d_off + 16), src.as_ptr().add(so), len) };
            prop_assert!(dst[..d_off + 16].iter().all(|&b| b == 0xAA));
            prop_assert_eq!(&dst[d_off + 16..d_off + 16 + len], &src[so..so + len]);
            prop_assert!(dst[d_off + 16 + len..].iter().all(|&b| b == 0xAA));
        }
    }
}
