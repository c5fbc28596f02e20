//! Copies whose destination lies just past their source, modulo a page.
//!
//! On this project's AMD EPYC guest (ERMS and FSRM), `rep movsb` moves
//! about 2.5 GB/s instead of 24-47 when the destination is 1 to 31 bytes
//! past the source modulo 4096 (measured with glibc's `memcpy` of 64 KiB,
//! distances 1, 8, 16 and 31 against 32, 64 and 4064; 33-63 ran at half
//! speed). glibc 2.36's `memcpy` uses `rep movsb` from 2112 bytes, and the
//! kernel's copy to and from user memory always does, so both a slot copy
//! and a `process_vm_readv` pull between such buffers ran 4-20x slow. Which
//! buffers meet that way is an accident of two processes' allocators: a
//! 2-rank shm stream of 64 KiB messages ran at 1.5 GB/s with
//! `GW_TRANSPORT=shm` and 6 GB/s without it, the TCP transport's
//! allocations having moved the buffers apart.
//!
//! [`copy`] takes an SSE2 loop for such pairs (every x86_64 CPU has it),
//! `memcpy` otherwise; [`bounced`] runs a pull or a one-sided transfer
//! through a bounce buffer placed so that the kernel's copy is not one of
//! them. (`GW_TRANSPORT=shm` is what `gwrun --transport shm` sets.)

/// Whether a copy of `len` bytes from `src` to `dst` is one `rep movsb`
/// runs slowly: on x86_64 (elsewhere there is no `rep movsb`, and a bounce
/// would be a copy for nothing), at least glibc's threshold for it, and
/// the destination 1 to 63 bytes past the source modulo a page (63, not
/// 31: the distances just above ran at half speed, and the loop costs
/// little).
pub(crate) fn near(dst: usize, src: usize, len: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && len >= NEAR_FROM
        && (1..64).contains(&(dst.wrapping_sub(src) & 4095))
}

/// A little under glibc's `rep movsb` threshold on this machine class
/// (0x840, 2112 bytes).
const NEAR_FROM: usize = 2048;

/// Copies `len` bytes from `src` to `dst` at full speed whatever their
/// distance (see the module comment).
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two
/// ranges must not overlap.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if near(dst as usize, src as usize, len) {
        // SAFETY: forwarded from the caller.
        unsafe { copy_sse2(dst, src, len) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Where in a bounce buffer starting at `base` a pull of bytes at `remote`
/// lands so that the kernel's copy runs at full speed: the same offset in
/// a page as the source (distance 0), so `base` needs a page of slack.
fn bounce_offset(base: usize, remote: usize) -> usize {
    remote.wrapping_sub(base) & 4095
}

/// Bytes a bounced transfer moves at a time: a few L2s' worth, so that the
/// second copy finds them in cache.
pub(crate) const BOUNCE_CHUNK: usize = 256 << 10;

thread_local! {
    /// This thread's bounce buffer (a page of slack in front, for the
    /// landing offset), made at its first bounced transfer.
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes this thread's bounce buffer now if it has none (see
/// [`bounced`]), so that its first bounced transfer allocates nothing.
pub(crate) fn make_bounce() {
    let _ = BOUNCE.try_with(|b| grow_bounce(&mut b.borrow_mut()));
}

/// The bounce buffer at its full size: a chunk and a page of slack.
fn grow_bounce(b: &mut Vec<u8>) {
    if b.len() < BOUNCE_CHUNK + 4096 {
        b.resize(BOUNCE_CHUNK + 4096, 0);
    }
}

/// Runs a transfer of `len` bytes with process memory at `remote` chunk by
/// chunk through this thread's bounce buffer: `step(remote_at, done,
/// bounce, n)` moves `n` bytes between `remote_at` and `bounce`, which
/// lies at `remote_at`'s offset in a page, so that the kernel's copy is at
/// full speed, and between `bounce` and the caller's buffer at `done`
/// with [`copy`]. `None`, having done nothing, where the thread's bounce
/// buffer is gone (a transfer from a thread-local destructor): the caller
/// then copies directly, slowly but correctly.
pub(crate) fn bounced<E>(
    remote: u64,
    len: usize,
    mut step: impl FnMut(u64, usize, *mut u8, usize) -> Result<(), E>,
) -> Option<Result<(), E>> {
    BOUNCE
        .try_with(|b| {
            let mut b = b.borrow_mut();
            grow_bounce(&mut b);
            let mut done = 0usize;
            while done < len {
                let n = (len - done).min(BOUNCE_CHUNK);
                let at = remote.wrapping_add(done as u64);
                let off = bounce_offset(b.as_ptr() as usize, at as usize);
                step(at, done, b[off..off + n].as_mut_ptr(), n)?;
                done += n;
            }
            Ok(())
        })
        .ok()
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller.
    let i = unsafe { copy_blocks::<false>(dst, src, len) };
    // SAFETY: the tail lies within both ranges; under 64 bytes, which
    // memcpy does without `rep movsb`.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
}

/// Copies the whole 64-byte blocks of `len` bytes with unaligned SSE2
/// loads and, with `STREAM`, streaming stores (`stream.rs`; `dst` must then
/// be 16-byte aligned), else unaligned stores. Returns the bytes copied.
///
/// # Safety
/// As for [`copy`], and `dst` 16-byte aligned where `STREAM`.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn copy_blocks<const STREAM: bool>(
    dst: *mut u8,
    src: *const u8,
    len: usize,
) -> usize {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128, _mm_stream_si128};
    let body = len / 64 * 64;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 64 <= len, within both ranges; loads are unaligned,
        // stores unaligned or (STREAM) to the aligned destination.
        unsafe {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let v = [
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            ];
            for (k, v) in v.into_iter().enumerate() {
                if STREAM {
                    _mm_stream_si128(d.add(k), v);
                } else {
                    _mm_storeu_si128(d.add(k), v);
                }
            }
        }
        i += 64;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn near_is_the_short_forward_distance_from_the_threshold() {
        let k = 1 << 20;
        assert!(near(k + 16, k, 4096));
        assert!(near(k + 4096 + 1, k, 4096));
        assert!(near(k + 63, k, NEAR_FROM));
        assert!(!near(k + 16, k, NEAR_FROM - 1));
        assert!(!near(k, k, 4096));
        assert!(!near(k + 64, k, 4096));
        assert!(!near(k, k + 16, 4096));
    }

    #[test]
    fn a_bounce_lands_at_the_sources_offset_in_a_page() {
        for (base, remote) in [(4096usize, 8192 + 16), (4096 + 100, 16), (0, 4095)] {
            let at = bounce_offset(base, remote);
            assert!(at < 4096);
            assert_eq!((base + at) & 4095, remote & 4095);
            assert!(!near(base + at, remote, 1 << 20));
        }
    }

    #[test]
    fn a_bounced_transfer_lands_each_chunk_at_its_page_offset() {
        let remote = (7u64 << 20) + 16;
        let len = 2 * BOUNCE_CHUNK + 100;
        let mut seen = Vec::new();
        let r: Option<Result<(), ()>> = bounced(remote, len, |at, done, bounce, n| {
            assert_eq!((bounce as usize).wrapping_sub(at as usize) & 4095, 0);
            assert_eq!(at, remote + done as u64);
            seen.push((done, n));
            Ok(())
        });
        assert_eq!(r, Some(Ok(())));
        assert_eq!(
            seen,
            [
                (0, BOUNCE_CHUNK),
                (BOUNCE_CHUNK, BOUNCE_CHUNK),
                (2 * BOUNCE_CHUNK, 100)
            ]
        );
        // A failing step stops the transfer with its error.
        let mut calls = 0;
        let r = bounced(remote, len, |_, _, _, _| {
            calls += 1;
            Err("no")
        });
        assert_eq!((r, calls), (Some(Err("no")), 1));
    }

    proptest! {
        /// Near or not, every length copies exactly and nothing around the
        /// destination is touched.
        #[test]
        fn copies_exactly(len in 0usize..12_000, so in 0usize..64, dist in 0usize..80) {
            let src: Vec<u8> = (0..len + so + 4096).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0xAAu8; len + 4096 + 256];
            let s = src.as_ptr().wrapping_add(so) as usize;
            // A destination `dist` bytes past the source, modulo a page.
            let base = dst.as_ptr() as usize;
            let d_off = (s.wrapping_add(dist).wrapping_sub(base).wrapping_sub(64) & 4095) + 64;
            // SAFETY: both ranges lie within their vectors and do not overlap.
            unsafe { copy(dst.as_mut_ptr().add(d_off), src.as_ptr().add(so), len) };
            prop_assert_eq!((base + d_off).wrapping_sub(s) & 4095, dist);
            prop_assert!(dst[..d_off].iter().all(|&b| b == 0xAA));
            prop_assert_eq!(&dst[d_off..d_off + len], &src[so..so + len]);
            prop_assert!(dst[d_off + len..].iter().all(|&b| b == 0xAA));
        }
    }
}
