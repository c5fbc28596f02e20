//! Reduction kernels: the element loops behind every `Action::Reduce` and
//! `Action::Copy` (see [`crate::algo`]).
//!
//! ## Semantics
//! [`Kernel::reduce`] computes `dst[i] = sa(a[i]) ⊕ sb(b[i])`, then, with
//! `finalize`, the operator's final step; [`Kernel::copy`] computes
//! `dst[i] = s(src[i])`, then the final step. `sa`, `sb`, `s` are the optional
//! local weight (Cannikin's r_i = b_i / Σb), applied by multiplication; the
//! engine passes one only for operands read from `Buf::Send`.
//!
//! | dtype | sum | prod | min / max | avg | weights |
//! |---|---|---|---|---|---|
//! | f32, f64 | IEEE | IEEE | fminf / fmaxf (below) | sum, then `/ nranks` | yes |
//! | f16, bf16 | in f32, rounded once | in f32, rounded once | exact | sum, then `/ nranks` | yes |
//! | i32, i64, u8 | wrapping | wrapping | exact | refused | refused |
//! | bytes | copy only | | | | |
//!
//! - **Floats.** Each step is one IEEE operation in the element type: the
//!   weight is rounded to the type (f32 for f32/f16/bf16), `x * w` is rounded,
//!   the operator is rounded, and avg's final step is a true division by
//!   `nranks` (correctly rounded, not a multiplication by `1/nranks`). There is
//!   no fused multiply-add, so every machine computes bit-identical results.
//! - **min/max and NaN** follow C's `fminf`/`fmaxf` (IEEE 754-2008
//!   minNum/maxNum): a NaN operand is ignored, the result is NaN only when both
//!   operands are. When the operands compare equal (including `-0` vs `+0`)
//!   the result is `a`'s value, so it is deterministic.
//! - **f16/bf16** are widened to f32 (exactly), combined in f32, and rounded
//!   once to the storage type, to nearest even, exactly as the `half` crate
//!   rounds. Every pairwise step is therefore correctly rounded: f32 has
//!   p' = 24 significand bits, f16 p = 11 and bf16 p = 8, and rounding twice
//!   (to f32, then to the storage type) is innocuous for +, ×, ÷ whenever
//!   p' ≥ 2p + 2 (Figueroa, 1995). This gives the same results as NCCL, which
//!   uses the hardware's half/bf16 arithmetic (itself correctly rounded) or
//!   float arithmetic with one final rounding. A weighted or averaged step runs
//!   its scale, operator and division in f32 and rounds to storage once at the
//!   end.
//! - **Integers** wrap on overflow (as C's unsigned arithmetic, and NCCL).
//!   Averages and weights are refused by [`Kernel::new`] and
//!   [`Kernel::check_weight`]: they cannot be represented without a silent
//!   truncation.
//!
//! ## Memory
//! Pointers may have any alignment (user buffers are often offset into a
//! byte array); loads and stores are unaligned, which costs nothing on x86
//! when the data is in fact aligned. `dst` may be exactly `a`, exactly `b`
//! (or both), or disjoint from them; partial overlap is a precondition
//! violation (checked in debug builds).
//!
//! ## Why `unsafe`
//! The kernels take raw pointers because they work on memory no Rust value
//! owns: the caller's buffers from the C ABI, registered scratch, and in-place
//! calls where the output aliases an input (so no `&mut` and `&` to them may
//! coexist). The contract is the usual one of `ptr::copy`: valid, non-null
//! pointers for `n` elements and no concurrent writers. Inside, each case
//! builds exactly the slices that are sound for its aliasing (one `&mut` for
//! `dst == a`, never an `&` to the same memory alongside it).
//!
//! ## Performance
//! Everything is decided once per call, outside the loop: the dtype, operator,
//! whether each operand is weighted, whether the call finalises, the aliasing
//! case (`dst == a`, `dst == b`, both, or three distinct operands) and the
//! instruction set select one of several hundred monomorphised loops
//! (`kernels`), which is then called through a function pointer. Each loop is
//! straight-line element code over slices that LLVM vectorises; the x86_64
//! build instantiates every loop twice, for the baseline (SSE2) and with
//! `#[target_feature(enable = "avx2,f16c")]`, and [`Isa::detect`] picks the
//! AVX2 one at run time (detected once and cached). f16/bf16 are widened,
//! combined and rounded in the same single pass: bf16 with integer arithmetic
//! that vectorises in the loop, f16 with F16C (`vcvtph2ps` → op →
//! `vcvtps2ph`, eight lanes at a time). Only the portable f16 path (no F16C)
//! stages blocks of 1024 elements through f32 buffers on the stack (4 KiB per
//! operand, never the heap) and converts them with `half`'s slice helpers.
//! No call allocates.
//!
//! Measured with `cargo bench -p gw-collectives --bench reduce [-- KIB]` on a
//! (shared, noisy) 2-core AVX2 machine, against a scalar loop with the same
//! semantics: f32 sum over 1 MiB buffers, ~1.6x (three operands, bound by
//! memory at ~47 GB/s touched; SSE2 and AVX2 then tie) and ~2.6x in place
//! (~80 GB/s); over 64 KiB buffers (L2), ~3.9x, with AVX2 ~1.4x SSE2; bf16
//! ~9x and f16 ~40-50x, where the naive loop converts one element at a time.

mod kernels;
mod narrow;
#[cfg(test)]
mod tests;
mod unaligned;

use crate::{DType, Error, RedOp, Result};
use kernels::{DISTINCT, DST_IS_A, DST_IS_AB, DST_IS_B, Half, OpSel, Params};
use std::sync::atomic::{AtomicU8, Ordering};

/// The instruction set a kernel runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The compilation target's baseline (SSE2 on x86_64).
    Portable,
    /// AVX2 and F16C (x86_64, detected at run time).
    Avx2,
}

impl Isa {
    /// The best instruction set this CPU supports (detected once, then cached).
    pub fn detect() -> Isa {
        static BEST: AtomicU8 = AtomicU8::new(0);
        match BEST.load(Ordering::Relaxed) {
            1 => Isa::Portable,
            2 => Isa::Avx2,
            _ => {
                let best = if Isa::Avx2.is_available() {
                    Isa::Avx2
                } else {
                    Isa::Portable
                };
                BEST.store(if best == Isa::Avx2 { 2 } else { 1 }, Ordering::Relaxed);
                best
            }
        }
    }

    /// Whether this CPU can run kernels built for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => false,
        }
    }

    /// A short name, for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
        }
    }
}

/// Per-call parameters.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub dtype: DType,
    pub op: RedOp,
    pub nranks: u32,
}

impl Kernel {
    /// Checks the dtype/op pair is supported: avg on integer types is refused
    /// (InvalidArgument naming both); `DType::Bytes` goes only with
    /// `RedOp::None`, and a `RedOp::None` kernel can only copy. Call once per
    /// operation before anything is sent.
    pub fn new(dtype: DType, op: RedOp, nranks: u32) -> Result<Kernel> {
        if nranks == 0 {
            return Err(Error::InvalidArgument(
                "a reduction needs at least one rank (nranks = 0)".into(),
            ));
        }
        if dtype == DType::Bytes && op != RedOp::None {
            return Err(Error::InvalidArgument(format!(
                "op {} on dtype {}: untyped bytes can only be copied, not reduced",
                op.name(),
                dtype.name()
            )));
        }
        if op == RedOp::Avg && !dtype.is_float() {
            return Err(Error::InvalidArgument(format!(
                "op avg on dtype {}: averaging is only supported on floating-point types \
                 (an integer average would truncate); use sum and divide",
                dtype.name()
            )));
        }
        Ok(Kernel { dtype, op, nranks })
    }

    /// Checks that a local weight can be applied to this dtype: `None` always;
    /// `Some(w)` only on floating-point types, and only if `w` is finite in the
    /// precision it is applied in (f64 for f64, f32 otherwise).
    pub fn check_weight(&self, w: Option<f64>) -> Result<()> {
        let Some(w) = w else { return Ok(()) };
        if !self.dtype.is_float() {
            return Err(Error::InvalidArgument(format!(
                "a weight ({w}) applies only to floating-point types, not dtype {}",
                self.dtype.name()
            )));
        }
        let finite = if self.dtype == DType::F64 {
            w.is_finite()
        } else {
            (w as f32).is_finite()
        };
        if !finite {
            return Err(Error::InvalidArgument(format!(
                "weight {w} is not finite in dtype {}",
                self.dtype.name()
            )));
        }
        Ok(())
    }

    /// `dst[i] = scale_a(a[i]) ⊕ scale_b(b[i])`, then if `finalize` the op's
    /// final step (avg: divide by nranks). `n` elements. `dst` may be exactly
    /// equal to `a` or to `b` (same pointer), never partially overlapping.
    ///
    /// # Safety
    /// `a` and `b` are valid for reads and `dst` for writes of `n` elements
    /// (any alignment; non-null unless `n == 0`); nothing else accesses them
    /// during the call; `dst` is `a`, `b`, or disjoint from both.
    ///
    /// A weight must have passed [`Kernel::check_weight`]; one on an integer
    /// type is a caller bug (a debug-build panic; ignored in release builds).
    ///
    /// # Panics
    /// On a `RedOp::None` or `DType::Bytes` kernel.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub unsafe fn reduce(
        &self,
        dst: *mut u8,
        a: *const u8,
        sa: Option<f64>,
        b: *const u8,
        sb: Option<f64>,
        n: usize,
        finalize: bool,
    ) {
        // SAFETY: forwarded contract; `detect` returns an available ISA.
        unsafe { self.reduce_with(Isa::detect(), dst, a, sa, b, sb, n, finalize) }
    }

    /// [`Kernel::reduce`] with a chosen instruction set (tests, benchmarks).
    ///
    /// # Safety
    /// As [`Kernel::reduce`].
    ///
    /// # Panics
    /// As [`Kernel::reduce`], and if `isa` is not available on this CPU.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_with(
        &self,
        isa: Isa,
        dst: *mut u8,
        a: *const u8,
        sa: Option<f64>,
        b: *const u8,
        sb: Option<f64>,
        n: usize,
        finalize: bool,
    ) {
        let op = match self.op {
            RedOp::Sum | RedOp::Avg => OpSel::Sum,
            RedOp::Prod => OpSel::Prod,
            RedOp::Min => OpSel::Min,
            RedOp::Max => OpSel::Max,
            RedOp::None => panic!("a RedOp::None kernel ({}) can only copy", self.dtype.name()),
        };
        assert!(
            isa.is_available(),
            "instruction set {} is not available on this CPU",
            isa.name()
        );
        if n == 0 {
            return;
        }
        let bytes = n * self.dtype.size();
        let al = if dst.cast_const() == a && dst.cast_const() == b {
            DST_IS_AB
        } else if dst.cast_const() == a {
            DST_IS_A
        } else if dst.cast_const() == b {
            DST_IS_B
        } else {
            DISTINCT
        };
        debug_assert!(
            (al & 1 != 0 || !overlaps(dst, a, bytes)) && (al & 2 != 0 || !overlaps(dst, b, bytes)),
            "reduce: dst partially overlaps an operand"
        );
        let div = finalize && self.op == RedOp::Avg;
        let (wa, wb) = (weight(sa), weight(sb));
        let f = match self.dtype {
            DType::F32 => {
                kernels::pick_bin_float::<f32>(isa, op, wa.is_some(), wb.is_some(), div, al)
            }
            DType::F64 => {
                kernels::pick_bin_float::<f64>(isa, op, wa.is_some(), wb.is_some(), div, al)
            }
            DType::F16 => {
                kernels::pick_bin_half(isa, Half::F16, op, wa.is_some(), wb.is_some(), div, al)
            }
            DType::Bf16 => {
                kernels::pick_bin_half(isa, Half::Bf16, op, wa.is_some(), wb.is_some(), div, al)
            }
            DType::I32 => kernels::pick_bin_int::<i32>(isa, op, al),
            DType::I64 => kernels::pick_bin_int::<i64>(isa, op, al),
            DType::U8 => kernels::pick_bin_int::<u8>(isa, op, al),
            DType::Bytes => panic!("untyped bytes can only be copied (op {})", self.op.name()),
        };
        debug_assert!(
            self.dtype.is_float() || (sa.is_none() && sb.is_none()),
            "weights on integer dtype {}",
            self.dtype.name()
        );
        let p = Params {
            sa: wa.unwrap_or(1.0),
            sb: wb.unwrap_or(1.0),
            div: self.nranks as f64,
        };
        // SAFETY: the caller's contract covers the pointers and `n`; `al` is
        // the actual aliasing; `f` was picked for `isa`, which is available.
        unsafe { f(dst, a, b, n, &p) }
    }

    /// `dst[i] = scale(src[i])` then finalize. `dst` may equal `src`.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `n` elements (any
    /// alignment; non-null unless `n == 0`); nothing else accesses them during
    /// the call; `dst` is `src` or disjoint from it.
    ///
    /// A weight must have passed [`Kernel::check_weight`]; one on a non-float
    /// type is a caller bug (a debug-build panic; ignored in release builds).
    #[inline]
    pub unsafe fn copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        s: Option<f64>,
        n: usize,
        finalize: bool,
    ) {
        // SAFETY: forwarded contract; `detect` returns an available ISA.
        unsafe { self.copy_with(Isa::detect(), dst, src, s, n, finalize) }
    }

    /// [`Kernel::copy`] with a chosen instruction set (tests, benchmarks).
    ///
    /// # Safety
    /// As [`Kernel::copy`].
    ///
    /// # Panics
    /// If `isa` is not available on this CPU.
    pub unsafe fn copy_with(
        &self,
        isa: Isa,
        dst: *mut u8,
        src: *const u8,
        s: Option<f64>,
        n: usize,
        finalize: bool,
    ) {
        assert!(
            isa.is_available(),
            "instruction set {} is not available on this CPU",
            isa.name()
        );
        if n == 0 {
            return;
        }
        let bytes = n * self.dtype.size();
        let in_place = dst.cast_const() == src;
        debug_assert!(
            in_place || !overlaps(dst, src, bytes),
            "copy: dst partially overlaps src"
        );
        debug_assert!(
            self.dtype.is_float() || s.is_none(),
            "weight on dtype {}",
            self.dtype.name()
        );
        let div = finalize && self.op == RedOp::Avg;
        let w = if self.dtype.is_float() {
            weight(s)
        } else {
            None
        };
        let f = match self.dtype {
            _ if w.is_none() && !div => None,
            DType::F32 => Some(kernels::pick_un_float::<f32>(
                isa,
                w.is_some(),
                div,
                in_place,
            )),
            DType::F64 => Some(kernels::pick_un_float::<f64>(
                isa,
                w.is_some(),
                div,
                in_place,
            )),
            DType::F16 => Some(kernels::pick_un_half(
                isa,
                Half::F16,
                w.is_some(),
                div,
                in_place,
            )),
            DType::Bf16 => Some(kernels::pick_un_half(
                isa,
                Half::Bf16,
                w.is_some(),
                div,
                in_place,
            )),
            DType::I32 | DType::I64 | DType::U8 | DType::Bytes => None,
        };
        match f {
            Some(f) => {
                let p = Params {
                    sa: w.unwrap_or(1.0),
                    sb: 1.0,
                    div: self.nranks as f64,
                };
                // SAFETY: the caller's contract covers the pointers and `n`;
                // `f` matches the aliasing and was picked for `isa`.
                unsafe { f(dst, src, n, &p) }
            }
            None if in_place => {}
            None => {
                // SAFETY: `src` and `dst` are valid for `bytes` bytes and do
                // not overlap (caller).
                unsafe { gw_transport::copy_bytes(dst, src, bytes) }
            }
        }
    }
}

/// A weight of exactly 1 is the identity and takes the unweighted loop.
fn weight(w: Option<f64>) -> Option<f64> {
    w.filter(|&w| w != 1.0)
}

/// Whether `[p, p + len)` and `[q, q + len)` intersect (debug checks only).
fn overlaps(p: *mut u8, q: *const u8, len: usize) -> bool {
    let (p, q) = (p as usize, q as usize);
    p < q.wrapping_add(len) && q < p.wrapping_add(len)
}
