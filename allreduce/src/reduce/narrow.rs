//! Widening f16/bf16 blocks to f32 and rounding them back.
//!
//! Both directions round exactly as the `half` crate does (round to nearest,
//! ties to even; NaN stays NaN, quieted): bf16 by integer arithmetic that the
//! compiler vectorises, f16 with the F16C instructions (`vcvtph2ps` /
//! `vcvtps2ph`, eight at a time) or, without them, `half`'s own slice
//! conversions.

use super::kernels::{BLOCK, Un};
use std::mem::MaybeUninit;

/// A block converter between a 16-bit float format and f32.
pub(crate) trait Conv {
    /// Widens `src` into `dst`, writing every element. `src.len() == dst.len() <= BLOCK`.
    ///
    /// # Safety
    /// The CPU supports the instructions the implementor uses.
    unsafe fn load(src: &[Un<u16>], dst: &mut [MaybeUninit<f32>]);
    /// Rounds `src` into `dst`. `src.len() == dst.len() <= BLOCK`.
    ///
    /// # Safety
    /// As [`Conv::load`].
    unsafe fn store(src: &[f32], dst: &mut [Un<u16>]);
}

/// bf16 → f32: exact (bf16 is the upper half of an f32).
#[inline(always)]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 → bf16, round to nearest even; a NaN keeps its sign and upper payload
/// and is quieted (as `half::bf16::from_f32`).
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    // Adding 0x7FFF plus the lowest kept bit carries into bit 16 exactly when
    // the discarded half is above a tie, or a tie with an odd kept part.
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) | 0x40) as u16;
    if x.is_nan() { quiet_nan } else { rounded }
}

/// bf16 in plain code: vectorised by the compiler under whichever target
/// features the calling kernel has.
pub(crate) struct Bf16;

impl Conv for Bf16 {
    #[inline(always)]
    unsafe fn load(src: &[Un<u16>], dst: &mut [MaybeUninit<f32>]) {
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(bf16_to_f32(s.0));
        }
    }

    #[inline(always)]
    unsafe fn store(src: &[f32], dst: &mut [Un<u16>]) {
        for (d, s) in dst.iter_mut().zip(src) {
            d.0 = f32_to_bf16(*s);
        }
    }
}

/// f16 through `half`'s slice conversions (which use F16C when the CPU has
/// it, software otherwise), via aligned stack copies.
pub(crate) struct F16Base;

impl Conv for F16Base {
    #[inline]
    unsafe fn load(src: &[Un<u16>], dst: &mut [MaybeUninit<f32>]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        let m = src.len();
        assert!(m <= BLOCK && dst.len() == m);
        let mut bits = [0u16; BLOCK];
        for (t, s) in bits.iter_mut().zip(src) {
            *t = s.0;
        }
        dst.fill(MaybeUninit::new(0.0));
        // SAFETY: every element of `dst` was just initialised, and
        // `MaybeUninit<f32>` has the layout of `f32`.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<f32>(), m) };
        bits[..m].reinterpret_cast::<half::f16>().convert_to_f32_slice(out);
    }

    #[inline]
    unsafe fn store(src: &[f32], dst: &mut [Un<u16>]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        let m = src.len();
        assert!(m <= BLOCK && dst.len() == m);
        let mut bits = [0u16; BLOCK];
        bits[..m].reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(src);
        for (d, s) in dst.iter_mut().zip(&bits[..m]) {
            d.0 = *s;
        }
    }
}

/// f16 with F16C, eight lanes per instruction. Only for AVX2 kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) struct F16Avx2;

#[cfg(target_arch = "x86_64")]
impl Conv for F16Avx2 {
    #[inline(always)]
    unsafe fn load(src: &[Un<u16>], dst: &mut [MaybeUninit<f32>]) {
        // SAFETY: the caller guarantees F16C and AVX2.
        unsafe { f16_load_f16c(src, dst) }
    }

    #[inline(always)]
    unsafe fn store(src: &[f32], dst: &mut [Un<u16>]) {
        // SAFETY: the caller guarantees F16C and AVX2.
        unsafe { f16_store_f16c(src, dst) }
    }
}

/// # Safety
/// The CPU supports F16C and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn f16_load_f16c(src: &[Un<u16>], dst: &mut [MaybeUninit<f32>]) {
    use std::arch::x86_64::*;
    let m = src.len();
    assert_eq!(dst.len(), m);
    let (sp, dp) = (src.as_ptr().cast::<__m128i>(), dst.as_mut_ptr().cast::<f32>());
    let full = m / 8;
    for k in 0..full {
        // SAFETY: lanes `8k..8k+8` are within both slices (`k < m / 8`);
        // unaligned load and store.
        unsafe { _mm256_storeu_ps(dp.add(8 * k), _mm256_cvtph_ps(_mm_loadu_si128(sp.add(k)))) };
    }
    let rest = m - 8 * full;
    if rest > 0 {
        let mut t = [0u16; 8];
        for (t, s) in t.iter_mut().zip(&src[8 * full..]) {
            *t = s.0;
        }
        let mut o = [0f32; 8];
        // SAFETY: `t` and `o` are 8-lane stack arrays.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(t.as_ptr().cast()))) };
        for (d, o) in dst[8 * full..].iter_mut().zip(o) {
            d.write(o);
        }
    }
}

/// # Safety
/// The CPU supports F16C and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn f16_store_f16c(src: &[f32], dst: &mut [Un<u16>]) {
    use std::arch::x86_64::*;
    let m = src.len();
    assert_eq!(dst.len(), m);
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr().cast::<__m128i>());
    let full = m / 8;
    for k in 0..full {
        // SAFETY: lanes `8k..8k+8` are within both slices; unaligned access.
        unsafe {
            let v = _mm256_loadu_ps(sp.add(8 * k));
            _mm_storeu_si128(dp.add(k), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        }
    }
    let rest = m - 8 * full;
    if rest > 0 {
        let mut t = [0f32; 8];
        t[..rest].copy_from_slice(&src[8 * full..]);
        let mut o = [0u16; 8];
        // SAFETY: `t` and `o` are 8-lane stack arrays.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(t.as_ptr()));
            _mm_storeu_si128(o.as_mut_ptr().cast(), h);
        }
        for (d, o) in dst[8 * full..].iter_mut().zip(o) {
            d.0 = o;
        }
    }
}
