//! The element loops, written once generically and monomorphised per
//! (instruction set, element type, operator, scaling, finalisation, aliasing).
//!
//! Every loop body is a plain `for` over slices of [`Un<T>`], so that LLVM sees
//! straight-line, branch-free element code over non-aliasing (`&mut` vs `&`)
//! slices and vectorises it without runtime overlap checks. The bodies are
//! `#[inline(always)]` and instantiated twice: inside a
//! `#[target_feature(enable = "avx2,f16c")]` function (256-bit vectors) and
//! inside a plain one (the target's baseline, SSE2 on x86_64).
//!
//! No FMA is enabled on purpose: Rust never contracts `a * s + b` into a fused
//! multiply-add, and the two variants must give bit-identical results so that
//! ranks on different hardware agree.

use super::narrow::{self, Conv};
use std::mem::MaybeUninit;
use std::ops::{Add, Div, Mul};

/// One element behind a pointer that may be unaligned for `T`.
///
/// `repr(packed)` gives it alignment 1, so a `&[Un<T>]` can be built from any
/// non-null pointer; fields are only ever read and written by value (never
/// borrowed), which compiles to unaligned vector loads and stores.
#[derive(Clone, Copy)]
#[repr(C, packed)]
pub(crate) struct Un<T: Copy>(pub T);

/// Builds a shared slice of `n` (possibly unaligned) elements.
///
/// # Safety
/// `p` is non-null and valid for reads of `n * size_of::<T>()` bytes for `'a`,
/// and nothing writes them through another pointer meanwhile.
#[inline(always)]
pub(crate) unsafe fn un<'a, T: Copy>(p: *const u8, n: usize) -> &'a [Un<T>] {
    // SAFETY: `Un<T>` has alignment 1 and the size of `T`; the caller vouches
    // for validity and exclusivity of the range.
    unsafe { std::slice::from_raw_parts(p.cast::<Un<T>>(), n) }
}

/// Builds a mutable slice of `n` (possibly unaligned) elements.
///
/// # Safety
/// As [`un`], for writes, and no other reference to the range is used for `'a`.
#[inline(always)]
pub(crate) unsafe fn un_mut<'a, T: Copy>(p: *mut u8, n: usize) -> &'a mut [Un<T>] {
    // SAFETY: as in `un`; the caller guarantees exclusivity.
    unsafe { std::slice::from_raw_parts_mut(p.cast::<Un<T>>(), n) }
}

/// Run-time values a kernel needs; the monomorphised kernel turns them into
/// typed constants once, before its loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    /// Scale of operand `a` (or of the copy source).
    pub sa: f64,
    /// Scale of operand `b`.
    pub sb: f64,
    /// Divisor of the finalisation step (the world size).
    pub div: f64,
}

/// A binary kernel: `dst, a, b, n, params`.
pub(crate) type BinFn = unsafe fn(*mut u8, *const u8, *const u8, usize, &Params);
/// A unary kernel: `dst, src, n, params`.
pub(crate) type UnFn = unsafe fn(*mut u8, *const u8, usize, &Params);

/// Aliasing cases, as const generic parameters.
pub(crate) const DISTINCT: u8 = 0;
/// `dst == a` (for unary kernels: `dst == src`).
pub(crate) const DST_IS_A: u8 = 1;
/// `dst == b`.
pub(crate) const DST_IS_B: u8 = 2;
/// `dst == a == b`.
pub(crate) const DST_IS_AB: u8 = 3;

/// Floating-point element types computed natively.
pub(crate) trait Float:
    Copy + 'static + Add<Output = Self> + Mul<Output = Self> + Div<Output = Self> + PartialOrd
{
    fn from_f64(x: f64) -> Self;
    #[allow(clippy::wrong_self_convention)]
    fn is_nan_(self) -> bool;
}

impl Float for f32 {
    #[inline(always)]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    fn is_nan_(self) -> bool {
        self.is_nan()
    }
}

impl Float for f64 {
    #[inline(always)]
    fn from_f64(x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn is_nan_(self) -> bool {
        self.is_nan()
    }
}

/// A binary reduction operator on `T`.
pub(crate) trait Op<T>: 'static {
    fn apply(a: T, b: T) -> T;
}

pub(crate) struct Sum;
pub(crate) struct Prod;
pub(crate) struct Min;
pub(crate) struct Max;

impl<T: Float> Op<T> for Sum {
    #[inline(always)]
    fn apply(a: T, b: T) -> T {
        a + b
    }
}

impl<T: Float> Op<T> for Prod {
    #[inline(always)]
    fn apply(a: T, b: T) -> T {
        a * b
    }
}

// fminf/fmaxf semantics: a NaN operand is ignored unless both are NaN. Ties
// (including -0 vs +0) return `a`, so the result is fully determined.
impl<T: Float> Op<T> for Min {
    #[inline(always)]
    fn apply(a: T, b: T) -> T {
        if b < a || a.is_nan_() { b } else { a }
    }
}

impl<T: Float> Op<T> for Max {
    #[inline(always)]
    fn apply(a: T, b: T) -> T {
        if b > a || a.is_nan_() { b } else { a }
    }
}

macro_rules! int_ops {
    ($($t:ty),*) => {$(
        impl Op<$t> for Sum {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.wrapping_add(b) }
        }
        impl Op<$t> for Prod {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
        }
        impl Op<$t> for Min {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.min(b) }
        }
        impl Op<$t> for Max {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.max(b) }
        }
    )*};
}
int_ops!(u8, i32, i64);

/// A per-element map fixed for the call: identity, scaling or division.
pub(crate) trait Map<T>: Copy + 'static {
    fn new(p: f64) -> Self;
    fn map(self, x: T) -> T;
}

/// The identity (no weight, or no finalisation).
#[derive(Clone, Copy)]
pub(crate) struct Id;

impl<T> Map<T> for Id {
    #[inline(always)]
    fn new(_: f64) -> Id {
        Id
    }
    #[inline(always)]
    fn map(self, x: T) -> T {
        x
    }
}

/// Multiplication by a weight, rounded once to `T`.
#[derive(Clone, Copy)]
pub(crate) struct Scale<T>(T);

impl<T: Float> Map<T> for Scale<T> {
    #[inline(always)]
    fn new(p: f64) -> Self {
        Scale(T::from_f64(p))
    }
    #[inline(always)]
    fn map(self, x: T) -> T {
        x * self.0
    }
}

/// Division by the world size (avg's final step). A true division, not a
/// multiplication by the reciprocal, so the result is correctly rounded.
#[derive(Clone, Copy)]
pub(crate) struct DivBy<T>(T);

impl<T: Float> Map<T> for DivBy<T> {
    #[inline(always)]
    fn new(p: f64) -> Self {
        DivBy(T::from_f64(p))
    }
    #[inline(always)]
    fn map(self, x: T) -> T {
        x / self.0
    }
}

/// `post(op(sa(x), sb(y)))`, the whole per-element computation.
#[inline(always)]
fn step<T, O: Op<T>, A: Map<T>, B: Map<T>, P: Map<T>>(ma: A, mb: B, mp: P, x: T, y: T) -> T {
    mp.map(O::apply(ma.map(x), mb.map(y)))
}

/// The binary loop for native types.
///
/// # Safety
/// `a`, `b` valid for reads and `dst` for writes of `n` elements of `T`
/// (any alignment, non-null); the aliasing between them is exactly `AL`.
#[inline(always)]
unsafe fn bin_body<T: Copy, O: Op<T>, A: Map<T>, B: Map<T>, P: Map<T>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mb, mp) = (A::new(p.sa), B::new(p.sb), P::new(p.div));
    match AL {
        DISTINCT => {
            // SAFETY: the caller guarantees the three ranges are valid and that
            // `dst` overlaps neither `a` nor `b` (they may overlap each other,
            // both being shared).
            let (d, a, b) = unsafe { (un_mut::<T>(dst, n), un::<T>(a, n), un::<T>(b, n)) };
            for ((d, a), b) in d.iter_mut().zip(a).zip(b) {
                d.0 = step::<T, O, A, B, P>(ma, mb, mp, a.0, b.0);
            }
        }
        DST_IS_A => {
            // SAFETY: `dst == a` and `b` does not overlap it (caller).
            let (d, b) = unsafe { (un_mut::<T>(dst, n), un::<T>(b, n)) };
            for (d, b) in d.iter_mut().zip(b) {
                d.0 = step::<T, O, A, B, P>(ma, mb, mp, d.0, b.0);
            }
        }
        DST_IS_B => {
            // SAFETY: `dst == b` and `a` does not overlap it (caller).
            let (d, a) = unsafe { (un_mut::<T>(dst, n), un::<T>(a, n)) };
            for (d, a) in d.iter_mut().zip(a) {
                d.0 = step::<T, O, A, B, P>(ma, mb, mp, a.0, d.0);
            }
        }
        _ => {
            // SAFETY: `dst == a == b`, one exclusive slice covers all three.
            let d = unsafe { un_mut::<T>(dst, n) };
            for d in d.iter_mut() {
                d.0 = step::<T, O, A, B, P>(ma, mb, mp, d.0, d.0);
            }
        }
    }
}

/// The unary (copy) loop for native types: `dst = post(scale(src))`.
///
/// # Safety
/// As [`bin_body`]; `AL` is `DISTINCT` or `DST_IS_A` (`dst == src`).
#[inline(always)]
unsafe fn un_body<T: Copy, A: Map<T>, P: Map<T>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mp) = (A::new(p.sa), P::new(p.div));
    if AL == DISTINCT {
        // SAFETY: valid, non-overlapping ranges (caller).
        let (d, s) = unsafe { (un_mut::<T>(dst, n), un::<T>(src, n)) };
        for (d, s) in d.iter_mut().zip(s) {
            d.0 = mp.map(ma.map(s.0));
        }
    } else {
        // SAFETY: `dst == src`, one exclusive slice (caller).
        let d = unsafe { un_mut::<T>(dst, n) };
        for d in d.iter_mut() {
            d.0 = mp.map(ma.map(d.0));
        }
    }
}

/// Elements per staging block for f16/bf16: 1024 f32 = 4 KiB per operand,
/// on the stack, so the widened operands stay in L1 between the passes.
pub(crate) const BLOCK: usize = 1024;

/// Reinterprets the first `m` staged elements as initialised.
///
/// # Safety
/// `buf[..m]` was fully written.
#[inline(always)]
unsafe fn staged(buf: &mut [MaybeUninit<f32>; BLOCK], m: usize) -> &mut [f32] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32` and the caller
    // guarantees the first `m` elements are initialised.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f32>(), m) }
}

/// The binary loop for f16/bf16: blocks of [`BLOCK`] elements are widened to
/// f32 on the stack, combined in f32, and rounded once back to storage.
///
/// Aliasing needs no special case: each block of `a` and `b` is read in full
/// before the same block of `dst` is written, and `dst` is either exactly `a`,
/// exactly `b` or disjoint from both.
///
/// # Safety
/// As [`bin_body`] with 2-byte elements, any aliasing allowed by the API;
/// the CPU supports what `C` requires.
#[inline(always)]
unsafe fn stage_bin_body<C: Conv, O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mb, mp) = (A::new(p.sa), B::new(p.sb), P::new(p.div));
    let mut fa = [MaybeUninit::<f32>::uninit(); BLOCK];
    let mut fb = [MaybeUninit::<f32>::uninit(); BLOCK];
    let mut off = 0;
    while off < n {
        let m = BLOCK.min(n - off);
        // SAFETY: `off + m <= n`, so both blocks are in bounds; the shared
        // slices are dead before `dst`'s block is borrowed mutably below.
        unsafe {
            C::load(un::<u16>(a.add(2 * off), m), &mut fa[..m]);
            C::load(un::<u16>(b.add(2 * off), m), &mut fb[..m]);
        }
        // SAFETY: `load` wrote `fa[..m]` and `fb[..m]`.
        let (xa, xb) = unsafe { (staged(&mut fa, m), &*staged(&mut fb, m)) };
        for (x, y) in xa.iter_mut().zip(xb) {
            *x = step::<f32, O, A, B, P>(ma, mb, mp, *x, *y);
        }
        // SAFETY: in bounds as above; no other borrow of this block is live.
        unsafe { C::store(xa, un_mut::<u16>(dst.add(2 * off), m)) };
        off += m;
    }
}

/// The unary (copy) loop for f16/bf16, staged like [`stage_bin_body`].
///
/// # Safety
/// As [`un_body`] with 2-byte elements; the CPU supports what `C` requires.
#[inline(always)]
unsafe fn stage_un_body<C: Conv, A: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mp) = (A::new(p.sa), P::new(p.div));
    let mut fs = [MaybeUninit::<f32>::uninit(); BLOCK];
    let mut off = 0;
    while off < n {
        let m = BLOCK.min(n - off);
        // SAFETY: in bounds; the shared slice is dead before `dst` is borrowed.
        unsafe { C::load(un::<u16>(src.add(2 * off), m), &mut fs[..m]) };
        // SAFETY: `load` wrote `fs[..m]`.
        let xs = unsafe { staged(&mut fs, m) };
        for x in xs.iter_mut() {
            *x = mp.map(ma.map(*x));
        }
        // SAFETY: in bounds; no other borrow of this block is live.
        unsafe { C::store(xs, un_mut::<u16>(dst.add(2 * off), m)) };
        off += m;
    }
}

// ---- instantiation per instruction set --------------------------------------

/// # Safety
/// As [`bin_body`].
unsafe fn bin_base<T: Copy, O: Op<T>, A: Map<T>, B: Map<T>, P: Map<T>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { bin_body::<T, O, A, B, P, AL>(dst, a, b, n, p) }
}

/// # Safety
/// As [`bin_body`], and the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn bin_avx2<T: Copy, O: Op<T>, A: Map<T>, B: Map<T>, P: Map<T>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { bin_body::<T, O, A, B, P, AL>(dst, a, b, n, p) }
}

/// # Safety
/// As [`un_body`].
unsafe fn un_base<T: Copy, A: Map<T>, P: Map<T>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { un_body::<T, A, P, AL>(dst, src, n, p) }
}

/// # Safety
/// As [`un_body`], and the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn un_avx2<T: Copy, A: Map<T>, P: Map<T>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { un_body::<T, A, P, AL>(dst, src, n, p) }
}

/// # Safety
/// As [`stage_bin_body`].
unsafe fn stage_bin_base<C: Conv, O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { stage_bin_body::<C, O, A, B, P>(dst, a, b, n, p) }
}

/// # Safety
/// As [`stage_bin_body`], and the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn stage_bin_avx2<C: Conv, O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { stage_bin_body::<C, O, A, B, P>(dst, a, b, n, p) }
}

/// # Safety
/// As [`stage_un_body`].
unsafe fn stage_un_base<C: Conv, A: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { stage_un_body::<C, A, P>(dst, src, n, p) }
}

/// # Safety
/// As [`stage_un_body`], and the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn stage_un_avx2<C: Conv, A: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { stage_un_body::<C, A, P>(dst, src, n, p) }
}

// ---- selection: run-time choices to monomorphised function pointers ----------

use super::Isa;

/// Which operator loop to run (avg is `Sum`, plus `DivBy` when finalising).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpSel {
    Sum,
    Prod,
    Min,
    Max,
}

fn pick_bin_native<T: Copy, O: Op<T>, A: Map<T>, B: Map<T>, P: Map<T>>(isa: Isa, al: u8) -> BinFn {
    macro_rules! by_isa {
        ($al:expr) => {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => bin_avx2::<T, O, A, B, P, { $al }> as BinFn,
                _ => bin_base::<T, O, A, B, P, { $al }> as BinFn,
            }
        };
    }
    match al {
        DISTINCT => by_isa!(DISTINCT),
        DST_IS_A => by_isa!(DST_IS_A),
        DST_IS_B => by_isa!(DST_IS_B),
        _ => by_isa!(DST_IS_AB),
    }
}

/// Kernel for a native float type.
pub(crate) fn pick_bin_float<T: Float>(
    isa: Isa,
    op: OpSel,
    scale_a: bool,
    scale_b: bool,
    div: bool,
    al: u8,
) -> BinFn {
    fn scales<T: Float, O: Op<T>, P: Map<T>>(isa: Isa, sa: bool, sb: bool, al: u8) -> BinFn {
        match (sa, sb) {
            (false, false) => pick_bin_native::<T, O, Id, Id, P>(isa, al),
            (true, false) => pick_bin_native::<T, O, Scale<T>, Id, P>(isa, al),
            (false, true) => pick_bin_native::<T, O, Id, Scale<T>, P>(isa, al),
            (true, true) => pick_bin_native::<T, O, Scale<T>, Scale<T>, P>(isa, al),
        }
    }
    match op {
        OpSel::Sum if div => scales::<T, Sum, DivBy<T>>(isa, scale_a, scale_b, al),
        OpSel::Sum => scales::<T, Sum, Id>(isa, scale_a, scale_b, al),
        OpSel::Prod => scales::<T, Prod, Id>(isa, scale_a, scale_b, al),
        OpSel::Min => scales::<T, Min, Id>(isa, scale_a, scale_b, al),
        OpSel::Max => scales::<T, Max, Id>(isa, scale_a, scale_b, al),
    }
}

/// Kernel for an integer type (no weights, no finalisation).
pub(crate) fn pick_bin_int<T: Copy>(isa: Isa, op: OpSel, al: u8) -> BinFn
where
    Sum: Op<T>,
    Prod: Op<T>,
    Min: Op<T>,
    Max: Op<T>,
{
    match op {
        OpSel::Sum => pick_bin_native::<T, Sum, Id, Id, Id>(isa, al),
        OpSel::Prod => pick_bin_native::<T, Prod, Id, Id, Id>(isa, al),
        OpSel::Min => pick_bin_native::<T, Min, Id, Id, Id>(isa, al),
        OpSel::Max => pick_bin_native::<T, Max, Id, Id, Id>(isa, al),
    }
}

/// Kernel for f16 (`bf16 == false`) or bf16, any aliasing.
pub(crate) fn pick_bin_half(
    isa: Isa,
    bf16: bool,
    op: OpSel,
    scale_a: bool,
    scale_b: bool,
    div: bool,
) -> BinFn {
    fn by_isa<O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(isa: Isa, bf16: bool) -> BinFn {
        match (isa, bf16) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => stage_bin_avx2::<narrow::F16Avx2, O, A, B, P> as BinFn,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => stage_bin_avx2::<narrow::Bf16, O, A, B, P> as BinFn,
            (_, false) => stage_bin_base::<narrow::F16Base, O, A, B, P> as BinFn,
            (_, true) => stage_bin_base::<narrow::Bf16, O, A, B, P> as BinFn,
        }
    }
    fn scales<O: Op<f32>, P: Map<f32>>(isa: Isa, bf16: bool, sa: bool, sb: bool) -> BinFn {
        match (sa, sb) {
            (false, false) => by_isa::<O, Id, Id, P>(isa, bf16),
            (true, false) => by_isa::<O, Scale<f32>, Id, P>(isa, bf16),
            (false, true) => by_isa::<O, Id, Scale<f32>, P>(isa, bf16),
            (true, true) => by_isa::<O, Scale<f32>, Scale<f32>, P>(isa, bf16),
        }
    }
    match op {
        OpSel::Sum if div => scales::<Sum, DivBy<f32>>(isa, bf16, scale_a, scale_b),
        OpSel::Sum => scales::<Sum, Id>(isa, bf16, scale_a, scale_b),
        OpSel::Prod => scales::<Prod, Id>(isa, bf16, scale_a, scale_b),
        OpSel::Min => scales::<Min, Id>(isa, bf16, scale_a, scale_b),
        OpSel::Max => scales::<Max, Id>(isa, bf16, scale_a, scale_b),
    }
}

/// Copy kernel for a native float type with a weight and/or a division
/// (a plain copy is a `memcpy` and never gets here).
pub(crate) fn pick_un_float<T: Float>(isa: Isa, scale: bool, div: bool, in_place: bool) -> UnFn {
    fn by_isa<T: Float, A: Map<T>, P: Map<T>>(isa: Isa, in_place: bool) -> UnFn {
        match (isa, in_place) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => un_avx2::<T, A, P, DISTINCT> as UnFn,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => un_avx2::<T, A, P, DST_IS_A> as UnFn,
            (_, false) => un_base::<T, A, P, DISTINCT> as UnFn,
            (_, true) => un_base::<T, A, P, DST_IS_A> as UnFn,
        }
    }
    match (scale, div) {
        (true, true) => by_isa::<T, Scale<T>, DivBy<T>>(isa, in_place),
        (true, false) => by_isa::<T, Scale<T>, Id>(isa, in_place),
        (false, _) => by_isa::<T, Id, DivBy<T>>(isa, in_place),
    }
}

/// Copy kernel for f16/bf16 with a weight and/or a division.
pub(crate) fn pick_un_half(isa: Isa, bf16: bool, scale: bool, div: bool) -> UnFn {
    fn by_isa<A: Map<f32>, P: Map<f32>>(isa: Isa, bf16: bool) -> UnFn {
        match (isa, bf16) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => stage_un_avx2::<narrow::F16Avx2, A, P> as UnFn,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => stage_un_avx2::<narrow::Bf16, A, P> as UnFn,
            (_, false) => stage_un_base::<narrow::F16Base, A, P> as UnFn,
            (_, true) => stage_un_base::<narrow::Bf16, A, P> as UnFn,
        }
    }
    match (scale, div) {
        (true, true) => by_isa::<Scale<f32>, DivBy<f32>>(isa, bf16),
        (true, false) => by_isa::<Scale<f32>, Id>(isa, bf16),
        (false, _) => by_isa::<Id, DivBy<f32>>(isa, bf16),
    }
}
