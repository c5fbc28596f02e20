//! Conversions between 16-bit floats and f32.
//!
//! Both directions round exactly as the `half` crate does (round to nearest,
//! ties to even; NaN stays NaN, quieted): bf16 by integer arithmetic that the
//! compiler vectorises inside the element loops, f16 with the F16C
//! instructions (`vcvtph2ps` / `vcvtps2ph`, eight lanes at a time) or,
//! without them, `half`'s own slice conversions.

use super::unaligned::{BLOCK, Un};
use std::mem::MaybeUninit;

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

/// f16 through `half`'s slice conversions (which use F16C when the CPU has
/// it, software otherwise), via aligned stack copies.
pub(crate) struct F16Base;

impl F16Base {
    /// Widens `src` into `dst`, writing every element. `src.len() == dst.len() <= BLOCK`.
    #[inline]
    pub(crate) fn load(src: &[Un<u16>], dst: &mut [MaybeUninit<f32>]) {
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
        bits[..m]
            .reinterpret_cast::<half::f16>()
            .convert_to_f32_slice(out);
    }

    /// Rounds `src` into `dst`. `src.len() == dst.len() <= BLOCK`.
    #[inline]
    pub(crate) fn store(src: &[f32], dst: &mut [Un<u16>]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        let m = src.len();
        assert!(m <= BLOCK && dst.len() == m);
        let mut bits = [0u16; BLOCK];
        bits[..m]
            .reinterpret_cast_mut::<half::f16>()
            .convert_from_f32_slice(src);
        for (d, s) in dst.iter_mut().zip(&bits[..m]) {
            d.0 = *s;
        }
    }
}

/// f16 with F16C: eight lanes per conversion, fused with the arithmetic.
/// For AVX2 kernels only.
#[cfg(target_arch = "x86_64")]
pub(crate) mod f16c {
    use super::Un;
    use std::arch::x86_64::{__m256, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128};
    use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_cvtps_ph};

    /// Widens eight f16.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) fn load8(s: &[Un<u16>; 8]) -> [f32; 8] {
        // SAFETY: `s` is 16 readable bytes (unaligned load); `__m256` and
        // `[f32; 8]` have the same size and no invalid bit patterns.
        unsafe {
            std::mem::transmute::<__m256, [f32; 8]>(_mm256_cvtph_ps(_mm_loadu_si128(
                s.as_ptr().cast(),
            )))
        }
    }

    /// Rounds eight f32 to f16, to nearest even.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) fn store8(d: &mut [Un<u16>; 8], v: [f32; 8]) {
        // SAFETY: as in `load8`; `d` is 16 writable bytes (unaligned store).
        unsafe {
            let v = std::mem::transmute::<[f32; 8], __m256>(v);
            _mm_storeu_si128(
                d.as_mut_ptr().cast(),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v),
            );
        }
    }

    /// A partial chunk padded with zeros.
    #[inline(always)]
    fn pad(s: &[Un<u16>]) -> [Un<u16>; 8] {
        let mut t = [Un(0u16); 8];
        t[..s.len()].copy_from_slice(s);
        t
    }

    /// `d[i] = f(a[i], b[i])` on f16 bits, computed in f32.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) fn zip3(
        d: &mut [Un<u16>],
        a: &[Un<u16>],
        b: &[Un<u16>],
        f: impl Fn(f32, f32) -> f32,
    ) {
        let (dc, dr) = d.as_chunks_mut::<8>();
        let ((ac, ar), (bc, br)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
        for ((d, a), b) in dc.iter_mut().zip(ac).zip(bc) {
            let (x, y) = (load8(a), load8(b));
            store8(d, std::array::from_fn(|i| f(x[i], y[i])));
        }
        if !dr.is_empty() {
            let (x, y) = (load8(&pad(ar)), load8(&pad(br)));
            let mut o = [Un(0u16); 8];
            store8(&mut o, std::array::from_fn(|i| f(x[i], y[i])));
            dr.copy_from_slice(&o[..dr.len()]);
        }
    }

    /// `d[i] = f(d[i], s[i])` on f16 bits, computed in f32.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) fn zip2(d: &mut [Un<u16>], s: &[Un<u16>], f: impl Fn(f32, f32) -> f32) {
        let (dc, dr) = d.as_chunks_mut::<8>();
        let (sc, sr) = s.as_chunks::<8>();
        for (d, s) in dc.iter_mut().zip(sc) {
            let (x, y) = (load8(d), load8(s));
            store8(d, std::array::from_fn(|i| f(x[i], y[i])));
        }
        if !dr.is_empty() {
            let (x, y) = (load8(&pad(dr)), load8(&pad(sr)));
            let mut o = [Un(0u16); 8];
            store8(&mut o, std::array::from_fn(|i| f(x[i], y[i])));
            let k = dr.len();
            dr.copy_from_slice(&o[..k]);
        }
    }

    /// `d[i] = f(d[i])` on f16 bits, computed in f32.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) fn zip1(d: &mut [Un<u16>], f: impl Fn(f32) -> f32) {
        let (dc, dr) = d.as_chunks_mut::<8>();
        for d in dc.iter_mut() {
            let x = load8(d);
            store8(d, std::array::from_fn(|i| f(x[i])));
        }
        if !dr.is_empty() {
            let x = load8(&pad(dr));
            let mut o = [Un(0u16); 8];
            store8(&mut o, std::array::from_fn(|i| f(x[i])));
            let k = dr.len();
            dr.copy_from_slice(&o[..k]);
        }
    }
}
