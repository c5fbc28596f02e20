//! The element loops, written once generically and monomorphised per
//! (instruction set, element type, operator, weights, finalisation, aliasing).
//!
//! Every loop is a plain `for` over slices of [`Un<T>`] whose body is
//! straight-line, branch-free element code, which LLVM vectorises. Each
//! aliasing case has its own loop: once inlined, the slices' no-alias
//! guarantee is gone and LLVM guards a vector loop with an overlap test (a
//! few instructions per call), which a three-operand loop run in place would
//! fail, falling back to scalar code; the `dst == a` loop reads and writes
//! through the one slice and passes it.
//!
//! The bodies are `#[inline(always)]` and instantiated twice: inside a
//! `#[target_feature(enable = "avx2,f16c")]` function (256-bit vectors) and
//! inside a plain one (the target's baseline, SSE2 on x86_64). FMA is not
//! enabled, on purpose: Rust never contracts `a * w + b` into a fused
//! multiply-add anyway, and both variants must give bit-identical results so
//! that ranks on different hardware agree.
//!
//! 16-bit floats are computed in f32, fused into the same single pass: bf16
//! converts with integer arithmetic inside the element loop (see [`Repr`]);
//! f16 with AVX2 converts eight lanes at a time with F16C. Only the portable
//! f16 path stages blocks through f32 buffers on the stack, converted with
//! `half`'s slice helpers.

use super::narrow::{self, F16Base};
pub(crate) use super::unaligned::{BLOCK, Un, un, un_mut};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::{Add, Div, Mul};

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

/// How elements are stored (`S`) and computed (`C`).
pub(crate) trait Repr: 'static {
    type S: Copy;
    type C: Copy;
    fn load(s: Self::S) -> Self::C;
    fn store(c: Self::C) -> Self::S;
}

/// Stored and computed as `T`.
pub(crate) struct Native<T>(PhantomData<T>);

impl<T: Copy + 'static> Repr for Native<T> {
    type S = T;
    type C = T;
    #[inline(always)]
    fn load(s: T) -> T {
        s
    }
    #[inline(always)]
    fn store(c: T) -> T {
        c
    }
}

/// bf16 bits computed as f32 (conversions are integer arithmetic, so they
/// vectorise inside the element loop).
pub(crate) struct Bf16;

impl Repr for Bf16 {
    type S = u16;
    type C = f32;
    #[inline(always)]
    fn load(s: u16) -> f32 {
        narrow::bf16_to_f32(s)
    }
    #[inline(always)]
    fn store(c: f32) -> u16 {
        narrow::f32_to_bf16(c)
    }
}

/// `d[i] = f(a[i], b[i])`.
#[inline(always)]
fn zip3<S: Copy>(d: &mut [Un<S>], a: &[Un<S>], b: &[Un<S>], f: impl Fn(S, S) -> S) {
    for ((d, a), b) in d.iter_mut().zip(a).zip(b) {
        d.0 = f(a.0, b.0);
    }
}

/// `d[i] = f(d[i], s[i])`.
#[inline(always)]
fn zip2<S: Copy>(d: &mut [Un<S>], s: &[Un<S>], f: impl Fn(S, S) -> S) {
    for (d, s) in d.iter_mut().zip(s) {
        d.0 = f(d.0, s.0);
    }
}

/// `d[i] = f(d[i])`.
#[inline(always)]
fn zip1<S: Copy>(d: &mut [Un<S>], f: impl Fn(S) -> S) {
    for d in d.iter_mut() {
        d.0 = f(d.0);
    }
}

/// The binary loop.
///
/// # Safety
/// `a`, `b` valid for reads and `dst` for writes of `n` elements of `R::S`
/// (any alignment, non-null); the aliasing between them is exactly `AL`.
#[inline(always)]
unsafe fn bin_body<R: Repr, O: Op<R::C>, A: Map<R::C>, B: Map<R::C>, P: Map<R::C>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mb, mp) = (A::new(p.sa), B::new(p.sb), P::new(p.div));
    let f = |x, y| R::store(step::<R::C, O, A, B, P>(ma, mb, mp, R::load(x), R::load(y)));
    match AL {
        // SAFETY: the caller guarantees the three ranges are valid and that
        // `dst` overlaps neither `a` nor `b` (which may overlap each other,
        // both being shared).
        DISTINCT => unsafe {
            zip3(
                un_mut::<R::S>(dst, n),
                un::<R::S>(a, n),
                un::<R::S>(b, n),
                f,
            )
        },
        // SAFETY: `dst == a`, and `b` does not overlap it (caller).
        DST_IS_A => unsafe { zip2(un_mut::<R::S>(dst, n), un::<R::S>(b, n), f) },
        // SAFETY: `dst == b`, and `a` does not overlap it (caller).
        DST_IS_B => unsafe { zip2(un_mut::<R::S>(dst, n), un::<R::S>(a, n), |d, a| f(a, d)) },
        // SAFETY: `dst == a == b`: one exclusive slice covers all three.
        _ => unsafe { zip1(un_mut::<R::S>(dst, n), |d| f(d, d)) },
    }
}

/// The unary (copy) loop: `dst = post(scale(src))`.
///
/// # Safety
/// As [`bin_body`]; `AL` is `DISTINCT` or `DST_IS_A` (`dst == src`).
#[inline(always)]
unsafe fn un_body<R: Repr, A: Map<R::C>, P: Map<R::C>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mp) = (A::new(p.sa), P::new(p.div));
    let f = |x| R::store(mp.map(ma.map(R::load(x))));
    if AL == DISTINCT {
        // SAFETY: valid, non-overlapping ranges (caller).
        unsafe { zip2(un_mut::<R::S>(dst, n), un::<R::S>(src, n), |_, s| f(s)) }
    } else {
        // SAFETY: `dst == src`: one exclusive slice (caller).
        unsafe { zip1(un_mut::<R::S>(dst, n), f) }
    }
}

// ---- f16 with F16C: eight lanes per conversion, fused ---------------------------

/// The f16 binary loop with F16C.
///
/// # Safety
/// As [`bin_body`] with 2-byte elements; the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn bin_f16c<O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    use narrow::f16c::{zip1, zip2, zip3};
    let (ma, mb, mp) = (A::new(p.sa), B::new(p.sb), P::new(p.div));
    let f = |x, y| step::<f32, O, A, B, P>(ma, mb, mp, x, y);
    match AL {
        // SAFETY: as in `bin_body`.
        DISTINCT => unsafe { zip3(un_mut::<u16>(dst, n), un::<u16>(a, n), un::<u16>(b, n), f) },
        // SAFETY: as in `bin_body`.
        DST_IS_A => unsafe { zip2(un_mut::<u16>(dst, n), un::<u16>(b, n), f) },
        // SAFETY: as in `bin_body`.
        DST_IS_B => unsafe { zip2(un_mut::<u16>(dst, n), un::<u16>(a, n), |d, a| f(a, d)) },
        // SAFETY: as in `bin_body`.
        _ => unsafe { zip1(un_mut::<u16>(dst, n), |d| f(d, d)) },
    }
}

/// The f16 unary loop with F16C.
///
/// # Safety
/// As [`un_body`] with 2-byte elements; the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn un_f16c<A: Map<f32>, P: Map<f32>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    use narrow::f16c::{zip1, zip2};
    let (ma, mp) = (A::new(p.sa), P::new(p.div));
    let f = |x| mp.map(ma.map(x));
    if AL == DISTINCT {
        // SAFETY: as in `un_body`.
        unsafe { zip2(un_mut::<u16>(dst, n), un::<u16>(src, n), |_, s| f(s)) }
    } else {
        // SAFETY: as in `un_body`.
        unsafe { zip1(un_mut::<u16>(dst, n), f) }
    }
}

// ---- f16 without F16C: staged through f32 blocks -----------------------------------

/// Gap between the two staging buffers, in f32: with the buffers exactly
/// 4 KiB apart, every load from one would falsely depend on the store to the
/// other at the same address modulo 4096 ("4K aliasing").
const SKEW: usize = 16;

/// Reinterprets a fully written staging slice as initialised.
///
/// # Safety
/// Every element of `buf` was written.
#[inline(always)]
unsafe fn staged(buf: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32` and the caller
    // guarantees every element is initialised.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f32>(), buf.len()) }
}

/// The portable f16 binary loop: blocks of [`BLOCK`] elements are widened to
/// f32 on the stack with `half`'s slice conversions (F16C when the CPU has
/// it, software otherwise), combined, and rounded back.
///
/// Aliasing needs no special case: each block of `a` and `b` is read in full
/// before the same block of `dst` is written, and `dst` is either exactly `a`,
/// exactly `b` or disjoint from both.
///
/// # Safety
/// As [`bin_body`] with 2-byte elements, any aliasing allowed by the API.
unsafe fn stage_bin<O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    let (ma, mb, mp) = (A::new(p.sa), B::new(p.sb), P::new(p.div));
    let mut stage = [MaybeUninit::<f32>::uninit(); 2 * BLOCK + SKEW];
    let (fa, fb) = stage.split_at_mut(BLOCK + SKEW);
    let mut off = 0;
    while off < n {
        let m = BLOCK.min(n - off);
        // SAFETY: `off + m <= n`, so both blocks are in bounds; the shared
        // slices are dead before `dst`'s block is borrowed mutably below.
        unsafe {
            F16Base::load(un::<u16>(a.add(2 * off), m), &mut fa[..m]);
            F16Base::load(un::<u16>(b.add(2 * off), m), &mut fb[..m]);
        }
        // SAFETY: `load` wrote `fa[..m]` and `fb[..m]`.
        let (xa, xb) = unsafe { (staged(&mut fa[..m]), &*staged(&mut fb[..m])) };
        for (x, y) in xa.iter_mut().zip(xb) {
            *x = step::<f32, O, A, B, P>(ma, mb, mp, *x, *y);
        }
        // SAFETY: in bounds as above; no other borrow of this block is live.
        F16Base::store(xa, unsafe { un_mut::<u16>(dst.add(2 * off), m) });
        off += m;
    }
}

/// The portable f16 unary loop, staged like [`stage_bin`].
///
/// # Safety
/// As [`un_body`] with 2-byte elements.
unsafe fn stage_un<A: Map<f32>, P: Map<f32>>(dst: *mut u8, src: *const u8, n: usize, p: &Params) {
    let (ma, mp) = (A::new(p.sa), P::new(p.div));
    let mut fs = [MaybeUninit::<f32>::uninit(); BLOCK];
    let mut off = 0;
    while off < n {
        let m = BLOCK.min(n - off);
        // SAFETY: in bounds; the shared slice is dead before `dst` is borrowed.
        unsafe { F16Base::load(un::<u16>(src.add(2 * off), m), &mut fs[..m]) };
        // SAFETY: `load` wrote `fs[..m]`.
        let xs = unsafe { staged(&mut fs[..m]) };
        for x in xs.iter_mut() {
            *x = mp.map(ma.map(*x));
        }
        // SAFETY: in bounds; no other borrow of this block is live.
        F16Base::store(xs, unsafe { un_mut::<u16>(dst.add(2 * off), m) });
        off += m;
    }
}

// ---- instantiation per instruction set ----------------------------------------------

/// # Safety
/// As [`bin_body`].
unsafe fn bin_base<R: Repr, O: Op<R::C>, A: Map<R::C>, B: Map<R::C>, P: Map<R::C>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { bin_body::<R, O, A, B, P, AL>(dst, a, b, n, p) }
}

/// # Safety
/// As [`bin_body`], and the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn bin_avx2<R: Repr, O: Op<R::C>, A: Map<R::C>, B: Map<R::C>, P: Map<R::C>, const AL: u8>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { bin_body::<R, O, A, B, P, AL>(dst, a, b, n, p) }
}

/// # Safety
/// As [`un_body`].
unsafe fn un_base<R: Repr, A: Map<R::C>, P: Map<R::C>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { un_body::<R, A, P, AL>(dst, src, n, p) }
}

/// # Safety
/// As [`un_body`], and the CPU supports AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn un_avx2<R: Repr, A: Map<R::C>, P: Map<R::C>, const AL: u8>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    p: &Params,
) {
    // SAFETY: forwarded contract.
    unsafe { un_body::<R, A, P, AL>(dst, src, n, p) }
}

// ---- selection: run-time choices to monomorphised function pointers -------------------

use super::Isa;

/// Which operator loop to run (avg is `Sum`, plus `DivBy` when finalising).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpSel {
    Sum,
    Prod,
    Min,
    Max,
}

/// The loop for representation `R`, by instruction set and aliasing case.
fn pick_bin_repr<R: Repr, O: Op<R::C>, A: Map<R::C>, B: Map<R::C>, P: Map<R::C>>(
    isa: Isa,
    al: u8,
) -> BinFn {
    macro_rules! by_isa {
        ($al:expr) => {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => bin_avx2::<R, O, A, B, P, { $al }> as BinFn,
                _ => bin_base::<R, O, A, B, P, { $al }> as BinFn,
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

/// The f16 loop: fused with F16C, staged otherwise.
fn pick_bin_f16<O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(isa: Isa, al: u8) -> BinFn {
    match (isa, al) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DISTINCT) => bin_f16c::<O, A, B, P, DISTINCT> as BinFn,
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DST_IS_A) => bin_f16c::<O, A, B, P, DST_IS_A> as BinFn,
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, DST_IS_B) => bin_f16c::<O, A, B, P, DST_IS_B> as BinFn,
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, _) => bin_f16c::<O, A, B, P, DST_IS_AB> as BinFn,
        _ => stage_bin::<O, A, B, P> as BinFn,
    }
}

/// Which 16-bit float a kernel stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    F16,
    Bf16,
}

/// Kernel for f32 or f64.
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
            (false, false) => pick_bin_repr::<Native<T>, O, Id, Id, P>(isa, al),
            (true, false) => pick_bin_repr::<Native<T>, O, Scale<T>, Id, P>(isa, al),
            (false, true) => pick_bin_repr::<Native<T>, O, Id, Scale<T>, P>(isa, al),
            (true, true) => pick_bin_repr::<Native<T>, O, Scale<T>, Scale<T>, P>(isa, al),
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

/// Kernel for f16 or bf16 (computed in f32).
pub(crate) fn pick_bin_half(
    isa: Isa,
    half: Half,
    op: OpSel,
    scale_a: bool,
    scale_b: bool,
    div: bool,
    al: u8,
) -> BinFn {
    fn by_half<O: Op<f32>, A: Map<f32>, B: Map<f32>, P: Map<f32>>(
        isa: Isa,
        half: Half,
        al: u8,
    ) -> BinFn {
        match half {
            Half::F16 => pick_bin_f16::<O, A, B, P>(isa, al),
            Half::Bf16 => pick_bin_repr::<Bf16, O, A, B, P>(isa, al),
        }
    }
    fn scales<O: Op<f32>, P: Map<f32>>(isa: Isa, half: Half, sa: bool, sb: bool, al: u8) -> BinFn {
        match (sa, sb) {
            (false, false) => by_half::<O, Id, Id, P>(isa, half, al),
            (true, false) => by_half::<O, Scale<f32>, Id, P>(isa, half, al),
            (false, true) => by_half::<O, Id, Scale<f32>, P>(isa, half, al),
            (true, true) => by_half::<O, Scale<f32>, Scale<f32>, P>(isa, half, al),
        }
    }
    match op {
        OpSel::Sum if div => scales::<Sum, DivBy<f32>>(isa, half, scale_a, scale_b, al),
        OpSel::Sum => scales::<Sum, Id>(isa, half, scale_a, scale_b, al),
        OpSel::Prod => scales::<Prod, Id>(isa, half, scale_a, scale_b, al),
        OpSel::Min => scales::<Min, Id>(isa, half, scale_a, scale_b, al),
        OpSel::Max => scales::<Max, Id>(isa, half, scale_a, scale_b, al),
    }
}

/// Kernel for an integer type (no weights, no finalisation).
pub(crate) fn pick_bin_int<T: Copy + 'static>(isa: Isa, op: OpSel, al: u8) -> BinFn
where
    Sum: Op<T>,
    Prod: Op<T>,
    Min: Op<T>,
    Max: Op<T>,
{
    match op {
        OpSel::Sum => pick_bin_repr::<Native<T>, Sum, Id, Id, Id>(isa, al),
        OpSel::Prod => pick_bin_repr::<Native<T>, Prod, Id, Id, Id>(isa, al),
        OpSel::Min => pick_bin_repr::<Native<T>, Min, Id, Id, Id>(isa, al),
        OpSel::Max => pick_bin_repr::<Native<T>, Max, Id, Id, Id>(isa, al),
    }
}

/// The unary loop for representation `R`.
fn pick_un_repr<R: Repr, A: Map<R::C>, P: Map<R::C>>(isa: Isa, in_place: bool) -> UnFn {
    match (isa, in_place) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, false) => un_avx2::<R, A, P, DISTINCT> as UnFn,
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, true) => un_avx2::<R, A, P, DST_IS_A> as UnFn,
        (_, false) => un_base::<R, A, P, DISTINCT> as UnFn,
        (_, true) => un_base::<R, A, P, DST_IS_A> as UnFn,
    }
}

/// Copy kernel for f32/f64 with a weight and/or a division (a plain copy is
/// a `memcpy` and never gets here).
pub(crate) fn pick_un_float<T: Float>(isa: Isa, scale: bool, div: bool, in_place: bool) -> UnFn {
    match (scale, div) {
        (true, true) => pick_un_repr::<Native<T>, Scale<T>, DivBy<T>>(isa, in_place),
        (true, false) => pick_un_repr::<Native<T>, Scale<T>, Id>(isa, in_place),
        (false, _) => pick_un_repr::<Native<T>, Id, DivBy<T>>(isa, in_place),
    }
}

/// Copy kernel for f16/bf16 with a weight and/or a division.
pub(crate) fn pick_un_half(isa: Isa, half: Half, scale: bool, div: bool, in_place: bool) -> UnFn {
    fn by_half<A: Map<f32>, P: Map<f32>>(isa: Isa, half: Half, in_place: bool) -> UnFn {
        match (half, isa, in_place) {
            (Half::Bf16, ..) => pick_un_repr::<Bf16, A, P>(isa, in_place),
            #[cfg(target_arch = "x86_64")]
            (Half::F16, Isa::Avx2, false) => un_f16c::<A, P, DISTINCT> as UnFn,
            #[cfg(target_arch = "x86_64")]
            (Half::F16, Isa::Avx2, true) => un_f16c::<A, P, DST_IS_A> as UnFn,
            (Half::F16, ..) => stage_un::<A, P> as UnFn,
        }
    }
    match (scale, div) {
        (true, true) => by_half::<Scale<f32>, DivBy<f32>>(isa, half, in_place),
        (true, false) => by_half::<Scale<f32>, Id>(isa, half, in_place),
        (false, _) => by_half::<Id, DivBy<f32>>(isa, half, in_place),
    }
}
