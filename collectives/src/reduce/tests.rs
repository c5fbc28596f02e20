//! Kernels against a scalar reference: every dtype × op × aliasing case ×
//! weight × finalize × length × alignment, on every instruction set this CPU
//! has.

use super::kernels::Un;
use super::narrow;
use super::{Isa, Kernel};
use crate::{DType, Error, RedOp};
use half::{bf16, f16};
use std::mem::MaybeUninit;

const LENS: [usize; 6] = [0, 1, 7, 31, 1000, 4099];
/// Byte offsets of (dst, a, b) from an 8-aligned base.
const OFFSETS: [(usize, usize, usize); 3] = [(0, 0, 0), (1, 3, 5), (2, 0, 6)];
const GUARD: u8 = 0xA5;
const NRANKS: u32 = 3;
const WA: f64 = 0.3;
const WB: f64 = -1.7;

fn isas() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

/// splitmix64: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-4, 4).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0
    }
}

fn special_f32(k: u64) -> f32 {
    [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        1e-40,
        -1e-40,
        f32::MAX,
        65504.0,
        1.0,
        -1.0,
    ][(k % 12) as usize]
}

fn special_f64(k: u64) -> f64 {
    [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        1e-310,
        -1e-310,
        f64::MAX,
        1.0,
        -1.0,
    ][(k % 11) as usize]
}

/// `n` random elements of `dtype`, with special values mixed in for floats.
fn random_elems(dtype: DType, n: usize, r: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let x = r.next();
        let special = x.is_multiple_of(16);
        match dtype {
            DType::F32 => {
                let v = if special {
                    special_f32(x >> 8)
                } else {
                    r.unit() as f32
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
            DType::F64 => {
                let v = if special {
                    special_f64(x >> 8)
                } else {
                    r.unit()
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
            DType::F16 => {
                // Random bit patterns cover NaNs, infinities and subnormals.
                let v = if special {
                    (x >> 16) as u16
                } else {
                    f16::from_f64(r.unit()).to_bits()
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
            DType::Bf16 => {
                let v = if special {
                    (x >> 16) as u16
                } else {
                    bf16::from_f64(r.unit()).to_bits()
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
            DType::I32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(x as i64).to_le_bytes()),
            DType::U8 | DType::Bytes => out.push(x as u8),
        }
    }
    out
}

// ---- the scalar reference ----------------------------------------------------

fn fmin_ref<T: PartialOrd + Copy>(x: T, y: T, nan: impl Fn(T) -> bool) -> T {
    if nan(x) {
        y
    } else if nan(y) || x <= y {
        x
    } else {
        y
    }
}

fn fmax_ref<T: PartialOrd + Copy>(x: T, y: T, nan: impl Fn(T) -> bool) -> T {
    if nan(x) {
        y
    } else if nan(y) || x >= y {
        x
    } else {
        y
    }
}

fn f32_step(op: RedOp, fin: bool, sa: Option<f64>, sb: Option<f64>, x: f32, y: f32) -> f32 {
    let x = sa.map_or(x, |w| x * w as f32);
    let y = sb.map_or(y, |w| y * w as f32);
    let r = match op {
        RedOp::Sum | RedOp::Avg => x + y,
        RedOp::Prod => x * y,
        RedOp::Min => fmin_ref(x, y, f32::is_nan),
        RedOp::Max => fmax_ref(x, y, f32::is_nan),
        RedOp::None => unreachable!(),
    };
    if fin && op == RedOp::Avg {
        r / NRANKS as f32
    } else {
        r
    }
}

fn f64_step(op: RedOp, fin: bool, sa: Option<f64>, sb: Option<f64>, x: f64, y: f64) -> f64 {
    let x = sa.map_or(x, |w| x * w);
    let y = sb.map_or(y, |w| y * w);
    let r = match op {
        RedOp::Sum | RedOp::Avg => x + y,
        RedOp::Prod => x * y,
        RedOp::Min => fmin_ref(x, y, f64::is_nan),
        RedOp::Max => fmax_ref(x, y, f64::is_nan),
        RedOp::None => unreachable!(),
    };
    if fin && op == RedOp::Avg {
        r / NRANKS as f64
    } else {
        r
    }
}

macro_rules! int_step {
    ($op:expr, $x:expr, $y:expr) => {
        match $op {
            RedOp::Sum => $x.wrapping_add($y),
            RedOp::Prod => $x.wrapping_mul($y),
            RedOp::Min => $x.min($y),
            RedOp::Max => $x.max($y),
            _ => unreachable!(),
        }
    };
}

/// The expected bytes of one element.
fn ref_elem(
    dtype: DType,
    op: RedOp,
    fin: bool,
    sa: Option<f64>,
    sb: Option<f64>,
    x: &[u8],
    y: &[u8],
) -> Vec<u8> {
    match dtype {
        DType::F32 => {
            let (x, y) = (
                f32::from_le_bytes(x.try_into().unwrap()),
                f32::from_le_bytes(y.try_into().unwrap()),
            );
            f32_step(op, fin, sa, sb, x, y).to_le_bytes().to_vec()
        }
        DType::F64 => {
            let (x, y) = (
                f64::from_le_bytes(x.try_into().unwrap()),
                f64::from_le_bytes(y.try_into().unwrap()),
            );
            f64_step(op, fin, sa, sb, x, y).to_le_bytes().to_vec()
        }
        DType::F16 => {
            let x = f16::from_le_bytes(x.try_into().unwrap()).to_f32();
            let y = f16::from_le_bytes(y.try_into().unwrap()).to_f32();
            f16::from_f32(f32_step(op, fin, sa, sb, x, y))
                .to_le_bytes()
                .to_vec()
        }
        DType::Bf16 => {
            let x = bf16::from_le_bytes(x.try_into().unwrap()).to_f32();
            let y = bf16::from_le_bytes(y.try_into().unwrap()).to_f32();
            bf16::from_f32(f32_step(op, fin, sa, sb, x, y))
                .to_le_bytes()
                .to_vec()
        }
        DType::I32 => {
            let (x, y) = (
                i32::from_le_bytes(x.try_into().unwrap()),
                i32::from_le_bytes(y.try_into().unwrap()),
            );
            int_step!(op, x, y).to_le_bytes().to_vec()
        }
        DType::I64 => {
            let (x, y) = (
                i64::from_le_bytes(x.try_into().unwrap()),
                i64::from_le_bytes(y.try_into().unwrap()),
            );
            int_step!(op, x, y).to_le_bytes().to_vec()
        }
        DType::U8 => vec![int_step!(op, x[0], y[0])],
        DType::Bytes => unreachable!(),
    }
}

/// The expected bytes of one copied element: `s(x)`, then avg's division.
fn ref_copy_elem(dtype: DType, op: RedOp, fin: bool, s: Option<f64>, x: &[u8]) -> Vec<u8> {
    let div = fin && op == RedOp::Avg;
    match dtype {
        DType::F32 => {
            let x = f32::from_le_bytes(x.try_into().unwrap());
            let v = s.map_or(x, |w| x * w as f32);
            (if div { v / NRANKS as f32 } else { v })
                .to_le_bytes()
                .to_vec()
        }
        DType::F64 => {
            let x = f64::from_le_bytes(x.try_into().unwrap());
            let v = s.map_or(x, |w| x * w);
            (if div { v / NRANKS as f64 } else { v })
                .to_le_bytes()
                .to_vec()
        }
        DType::F16 | DType::Bf16 => {
            let bits = u16::from_le_bytes(x.try_into().unwrap());
            let bf = dtype == DType::Bf16;
            let x = if bf {
                bf16::from_bits(bits).to_f32()
            } else {
                f16::from_bits(bits).to_f32()
            };
            if s.is_none() && !div {
                // A plain copy moves the bits untouched (NaN payloads included).
                return bits.to_le_bytes().to_vec();
            }
            let v = s.map_or(x, |w| x * w as f32);
            let v = if div { v / NRANKS as f32 } else { v };
            if bf {
                bf16::from_f32(v).to_le_bytes().to_vec()
            } else {
                f16::from_f32(v).to_le_bytes().to_vec()
            }
        }
        _ => x.to_vec(),
    }
}

/// Element-wise equality: bit-exact, except that any NaN equals any NaN.
fn same_elem(dtype: DType, got: &[u8], want: &[u8]) -> bool {
    got == want
        || match dtype {
            DType::F32 => {
                f32::from_le_bytes(got.try_into().unwrap()).is_nan()
                    && f32::from_le_bytes(want.try_into().unwrap()).is_nan()
            }
            DType::F64 => {
                f64::from_le_bytes(got.try_into().unwrap()).is_nan()
                    && f64::from_le_bytes(want.try_into().unwrap()).is_nan()
            }
            DType::F16 => {
                f16::from_le_bytes(got.try_into().unwrap()).is_nan()
                    && f16::from_le_bytes(want.try_into().unwrap()).is_nan()
            }
            DType::Bf16 => {
                bf16::from_le_bytes(got.try_into().unwrap()).is_nan()
                    && bf16::from_le_bytes(want.try_into().unwrap()).is_nan()
            }
            _ => false,
        }
}

// ---- buffers with guard bytes --------------------------------------------------

/// A buffer whose data starts `off` bytes past an 8-aligned base, surrounded
/// by guard bytes that must survive the call.
struct Region {
    words: Vec<u64>,
    off: usize,
    len: usize,
}

impl Region {
    fn new(data: &[u8], off: usize) -> Region {
        let words = vec![u64::from_ne_bytes([GUARD; 8]); (off + data.len() + 64) / 8 + 1];
        let mut r = Region {
            words,
            off: off + 8,
            len: data.len(),
        };
        let o = r.off;
        r.bytes_mut()[o..o + data.len()].copy_from_slice(data);
        r
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: a `Vec<u64>`'s storage is initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.words.len() * 8) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively borrowed.
        unsafe {
            std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.words.len() * 8)
        }
    }
    fn ptr(&mut self) -> *mut u8 {
        // SAFETY: `off <= len of the storage`.
        unsafe { self.words.as_mut_ptr().cast::<u8>().add(self.off) }
    }
    fn data(&self) -> &[u8] {
        &self.bytes()[self.off..self.off + self.len]
    }
    fn guards_intact(&self) -> bool {
        let b = self.bytes();
        b[..self.off]
            .iter()
            .chain(&b[self.off + self.len..])
            .all(|&x| x == GUARD)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alias {
    Distinct,
    DstA,
    DstB,
    DstAB,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    isa: Isa,
    dtype: DType,
    op: RedOp,
    alias: Alias,
    sa: Option<f64>,
    sb: Option<f64>,
    fin: bool,
    n: usize,
    offs: (usize, usize, usize),
}

fn run_reduce(c: Case, r: &mut Rng) {
    let k = Kernel::new(c.dtype, c.op, NRANKS).unwrap();
    let sz = c.dtype.size();
    let xa = random_elems(c.dtype, c.n, r);
    let xb = if c.alias == Alias::DstAB {
        xa.clone()
    } else {
        random_elems(c.dtype, c.n, r)
    };
    let mut want = Vec::with_capacity(xa.len());
    for i in 0..c.n {
        let e = i * sz..(i + 1) * sz;
        want.extend(ref_elem(
            c.dtype,
            c.op,
            c.fin,
            c.sa,
            c.sb,
            &xa[e.clone()],
            &xb[e],
        ));
    }
    let (od, oa, ob) = c.offs;
    let mut ra = Region::new(&xa, oa);
    let mut rb = Region::new(&xb, ob);
    let mut rd = Region::new(&vec![0x5A; xa.len()], od);
    let (pa, pb) = (ra.ptr(), rb.ptr());
    let (dst, a, b) = match c.alias {
        Alias::Distinct => (rd.ptr(), pa, pb),
        Alias::DstA => (pa, pa, pb),
        Alias::DstB => (pb, pa, pb),
        Alias::DstAB => (pa, pa, pa),
    };
    // SAFETY: the regions hold `n` elements at each pointer; aliasing is exact.
    unsafe { k.reduce_with(c.isa, dst, a, c.sa, b, c.sb, c.n, c.fin) };
    let got = match c.alias {
        Alias::Distinct => &rd,
        Alias::DstA | Alias::DstAB => &ra,
        Alias::DstB => &rb,
    };
    for i in 0..c.n {
        let e = i * sz..(i + 1) * sz;
        assert!(
            same_elem(c.dtype, &got.data()[e.clone()], &want[e.clone()]),
            "{c:?}: element {i}: a={:02x?} b={:02x?} got {:02x?} want {:02x?}",
            &xa[e.clone()],
            &xb[e.clone()],
            &got.data()[e.clone()],
            &want[e]
        );
    }
    assert!(
        ra.guards_intact() && rb.guards_intact() && rd.guards_intact(),
        "{c:?}: wrote out of bounds"
    );
    if c.alias != Alias::DstA && c.alias != Alias::DstAB {
        assert_eq!(ra.data(), &xa[..], "{c:?}: a modified");
    }
    if c.alias != Alias::DstB {
        assert_eq!(rb.data(), &xb[..], "{c:?}: b modified");
    }
    if c.alias != Alias::Distinct {
        assert!(
            rd.data().iter().all(|&x| x == 0x5A),
            "{c:?}: unused dst written"
        );
    }
}

fn reduce_all(dtype: DType) {
    let mut r = Rng(dtype as u64 + 1);
    let weights: &[(Option<f64>, Option<f64>)] = if dtype.is_float() {
        &[
            (None, None),
            (Some(WA), None),
            (None, Some(WB)),
            (Some(WA), Some(WB)),
        ]
    } else {
        &[(None, None)]
    };
    let mut cases = 0;
    for isa in isas() {
        for op in RedOp::ALL {
            if op == RedOp::Avg && !dtype.is_float() {
                continue;
            }
            for alias in [Alias::Distinct, Alias::DstA, Alias::DstB, Alias::DstAB] {
                for &(sa, sb) in weights {
                    for fin in [false, true] {
                        for n in LENS {
                            for offs in OFFSETS {
                                run_reduce(
                                    Case {
                                        isa,
                                        dtype,
                                        op,
                                        alias,
                                        sa,
                                        sb,
                                        fin,
                                        n,
                                        offs,
                                    },
                                    &mut r,
                                );
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 0);
}

#[test]
fn reduce_f32() {
    reduce_all(DType::F32);
}

#[test]
fn reduce_f64() {
    reduce_all(DType::F64);
}

#[test]
fn reduce_f16() {
    reduce_all(DType::F16);
}

#[test]
fn reduce_bf16() {
    reduce_all(DType::Bf16);
}

#[test]
fn reduce_i32() {
    reduce_all(DType::I32);
}

#[test]
fn reduce_i64() {
    reduce_all(DType::I64);
}

#[test]
fn reduce_u8() {
    reduce_all(DType::U8);
}

fn copy_all(dtype: DType, ops: &[RedOp]) {
    let mut r = Rng(100 + dtype as u64);
    let weights: &[Option<f64>] = if dtype.is_float() {
        &[None, Some(WA), Some(1.0)]
    } else {
        &[None]
    };
    for isa in isas() {
        for &op in ops {
            let k = Kernel::new(dtype, op, NRANKS).unwrap();
            for in_place in [false, true] {
                for &s in weights {
                    for fin in [false, true] {
                        for n in LENS {
                            for (od, os, _) in OFFSETS {
                                let sz = dtype.size();
                                let xs = random_elems(dtype, n, &mut r);
                                let mut want = Vec::new();
                                for i in 0..n {
                                    want.extend(ref_copy_elem(
                                        dtype,
                                        op,
                                        fin,
                                        s,
                                        &xs[i * sz..(i + 1) * sz],
                                    ));
                                }
                                let mut rs = Region::new(&xs, os);
                                let mut rd = Region::new(&vec![0x5A; xs.len()], od);
                                let src = rs.ptr();
                                let dst = if in_place { src } else { rd.ptr() };
                                // SAFETY: both regions hold `n` elements.
                                unsafe { k.copy_with(isa, dst, src, s, n, fin) };
                                let got = if in_place { &rs } else { &rd };
                                for i in 0..n {
                                    let e = i * sz..(i + 1) * sz;
                                    assert!(
                                        same_elem(dtype, &got.data()[e.clone()], &want[e.clone()]),
                                        "copy {isa:?} {dtype:?} {op:?} in_place={in_place} s={s:?} fin={fin} n={n}: \
                                         element {i}: src={:02x?} got {:02x?} want {:02x?}",
                                        &xs[e.clone()],
                                        &got.data()[e.clone()],
                                        &want[e]
                                    );
                                }
                                assert!(rs.guards_intact() && rd.guards_intact());
                                if !in_place {
                                    assert_eq!(rs.data(), &xs[..]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn copy_floats() {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::Bf16] {
        copy_all(dtype, &[RedOp::Sum, RedOp::Avg, RedOp::None]);
    }
}

#[test]
fn copy_ints_and_bytes() {
    for dtype in [DType::I32, DType::I64, DType::U8] {
        copy_all(dtype, &[RedOp::Sum, RedOp::Max, RedOp::None]);
    }
    copy_all(DType::Bytes, &[RedOp::None]);
}

// ---- validation ------------------------------------------------------------------

#[test]
fn new_refuses_unsupported_pairs() {
    for dtype in [DType::I32, DType::I64, DType::U8] {
        match Kernel::new(dtype, RedOp::Avg, 4) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("avg") && m.contains(dtype.name()), "{m}")
            }
            other => panic!("{dtype:?} avg: {other:?}"),
        }
    }
    for op in RedOp::ALL {
        match Kernel::new(DType::Bytes, op, 4) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(op.name()) && m.contains("bytes"), "{m}")
            }
            other => panic!("bytes {op:?}: {other:?}"),
        }
    }
    assert!(matches!(
        Kernel::new(DType::F32, RedOp::Sum, 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(Kernel::new(DType::Bytes, RedOp::None, 4).is_ok());
    for dtype in DType::ALL {
        assert!(Kernel::new(dtype, RedOp::None, 4).is_ok());
        for op in RedOp::ALL {
            assert_eq!(
                Kernel::new(dtype, op, 4).is_ok(),
                op != RedOp::Avg || dtype.is_float(),
                "{dtype:?} {op:?}"
            );
        }
    }
}

#[test]
fn check_weight_only_on_floats() {
    for dtype in DType::ALL.into_iter().chain([DType::Bytes]) {
        let k = Kernel {
            dtype,
            op: RedOp::None,
            nranks: 2,
        };
        assert!(k.check_weight(None).is_ok());
        match k.check_weight(Some(0.25)) {
            Ok(()) => assert!(dtype.is_float(), "{dtype:?}"),
            Err(Error::InvalidArgument(m)) => {
                assert!(!dtype.is_float() && m.contains(dtype.name()), "{m}")
            }
            Err(e) => panic!("{e}"),
        }
    }
    let k = Kernel::new(DType::F32, RedOp::Sum, 2).unwrap();
    assert!(k.check_weight(Some(f64::NAN)).is_err());
    assert!(k.check_weight(Some(1e300)).is_err(), "overflows f32");
    let k = Kernel::new(DType::F64, RedOp::Sum, 2).unwrap();
    assert!(k.check_weight(Some(1e300)).is_ok());
    assert!(k.check_weight(Some(f64::INFINITY)).is_err());
}

#[test]
#[should_panic(expected = "can only copy")]
fn reduce_on_none_kernel_panics() {
    let k = Kernel::new(DType::F32, RedOp::None, 2).unwrap();
    let mut x = [0f32; 4];
    let p = x.as_mut_ptr().cast::<u8>();
    // SAFETY: `x` holds 4 elements; dst == a == b.
    unsafe { k.reduce(p, p, None, p, None, 4, false) };
}

#[test]
fn zero_length_accepts_null() {
    for isa in isas() {
        let k = Kernel::new(DType::F32, RedOp::Avg, 2).unwrap();
        let null = std::ptr::null_mut::<u8>();
        // SAFETY: n == 0: the pointers are never dereferenced.
        unsafe {
            k.reduce_with(isa, null, null, Some(0.5), null, None, 0, true);
            k.copy_with(isa, null, null, Some(0.5), 0, true);
        }
    }
}

// ---- spot checks of the documented semantics --------------------------------------

fn reduce_f32_pair(op: RedOp, x: f32, y: f32) -> f32 {
    let k = Kernel::new(DType::F32, op, 2).unwrap();
    let mut out = vec![0f32; 9];
    for isa in isas() {
        // 9 elements: a vector body and a scalar tail on every ISA.
        let (a, b) = (vec![x; 9], vec![y; 9]);
        // SAFETY: three distinct 9-element buffers.
        unsafe {
            k.reduce_with(
                isa,
                out.as_mut_ptr().cast(),
                a.as_ptr().cast(),
                None,
                b.as_ptr().cast(),
                None,
                9,
                true,
            )
        };
        assert!(
            out.iter().all(|v| v.to_bits() == out[0].to_bits()),
            "{isa:?} {op:?} {x} {y}: {out:?}"
        );
    }
    out[0]
}

#[test]
fn float_min_max_ignore_nan_and_prefer_a_on_ties() {
    let nan = f32::NAN;
    assert_eq!(reduce_f32_pair(RedOp::Min, nan, 2.0), 2.0);
    assert_eq!(reduce_f32_pair(RedOp::Min, 2.0, nan), 2.0);
    assert_eq!(reduce_f32_pair(RedOp::Max, nan, -2.0), -2.0);
    assert_eq!(reduce_f32_pair(RedOp::Max, -2.0, nan), -2.0);
    assert!(reduce_f32_pair(RedOp::Min, nan, nan).is_nan());
    assert_eq!(
        reduce_f32_pair(RedOp::Min, -0.0, 0.0).to_bits(),
        (-0.0f32).to_bits()
    );
    assert_eq!(
        reduce_f32_pair(RedOp::Min, 0.0, -0.0).to_bits(),
        0.0f32.to_bits()
    );
    assert_eq!(
        reduce_f32_pair(RedOp::Max, 0.0, -0.0).to_bits(),
        0.0f32.to_bits()
    );
    assert_eq!(
        reduce_f32_pair(RedOp::Min, f32::NEG_INFINITY, 1.0),
        f32::NEG_INFINITY
    );
    assert!(reduce_f32_pair(RedOp::Sum, nan, 1.0).is_nan());
}

#[test]
fn avg_divides_exactly() {
    // 0.1 + 0.2 in f32, divided (not multiplied by 1/3) by 3.
    let k = Kernel::new(DType::F32, RedOp::Avg, 3).unwrap();
    let (a, b) = ([0.1f32; 5], [0.2f32; 5]);
    let mut d = [0f32; 5];
    // SAFETY: distinct 5-element buffers.
    unsafe {
        k.reduce(
            d.as_mut_ptr().cast(),
            a.as_ptr().cast(),
            None,
            b.as_ptr().cast(),
            None,
            5,
            true,
        )
    };
    assert!(d.iter().all(|&v| v == (0.1f32 + 0.2f32) / 3.0));
    // Without finalize, avg is sum.
    // SAFETY: as above.
    unsafe {
        k.reduce(
            d.as_mut_ptr().cast(),
            a.as_ptr().cast(),
            None,
            b.as_ptr().cast(),
            None,
            5,
            false,
        )
    };
    assert!(d.iter().all(|&v| v == 0.1f32 + 0.2f32));
}

#[test]
fn integers_wrap() {
    let k = Kernel::new(DType::U8, RedOp::Sum, 2).unwrap();
    let (a, b) = ([250u8; 40], [10u8; 40]);
    let mut d = [0u8; 40];
    // SAFETY: distinct 40-element buffers.
    unsafe { k.reduce(d.as_mut_ptr(), a.as_ptr(), None, b.as_ptr(), None, 40, true) };
    assert!(d.iter().all(|&v| v == 4));
    let k = Kernel::new(DType::I32, RedOp::Prod, 2).unwrap();
    let (a, b) = ([i32::MAX; 40], [2i32; 40]);
    let mut d = [0i32; 40];
    // SAFETY: distinct 40-element buffers.
    unsafe {
        k.reduce(
            d.as_mut_ptr().cast(),
            a.as_ptr().cast(),
            None,
            b.as_ptr().cast(),
            None,
            40,
            true,
        )
    };
    assert!(d.iter().all(|&v| v == -2));
}

#[test]
fn half_sums_round_once_to_nearest_even() {
    // 1 + 2^-11 is exactly halfway between two f16 values: ties to even (1.0);
    // 1 + 3·2^-11 rounds up to 1 + 2^-9 (even).
    let k = Kernel::new(DType::F16, RedOp::Sum, 2).unwrap();
    for isa in isas() {
        let a = [f16::ONE; 2];
        let b = [
            f16::from_f32(2f32.powi(-11)),
            f16::from_f32(3.0 * 2f32.powi(-11)),
        ];
        let mut d = [f16::ZERO; 2];
        // SAFETY: distinct 2-element buffers.
        unsafe {
            k.reduce_with(
                isa,
                d.as_mut_ptr().cast(),
                a.as_ptr().cast(),
                None,
                b.as_ptr().cast(),
                None,
                2,
                false,
            )
        };
        assert_eq!(d, [f16::ONE, f16::from_f32(1.0 + 2f32.powi(-9))], "{isa:?}");
    }
}

// ---- the conversions against `half` ---------------------------------------------

/// f32 bit patterns: a stride through all 2^32, plus every pattern around
/// the rounding boundaries of the low 16 bits.
fn f32_patterns() -> Vec<u32> {
    let mut v: Vec<u32> = (0..1u64 << 32).step_by(4093).map(|x| x as u32).collect();
    for hi in [
        0x0000u32, 0x0001, 0x3F80, 0x3F81, 0x7F7F, 0x7F80, 0x7FC0, 0x8000, 0xBF80, 0xFF7F, 0xFF80,
        0x477F,
    ] {
        for lo in [
            0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000,
        ] {
            v.push(hi << 16 | lo);
        }
    }
    v
}

/// Checks a block conversion pair against `half` on [`f32_patterns`].
fn check_conv(
    store: impl Fn(&[f32], &mut [Un<u16>]),
    load: impl Fn(&[Un<u16>], &mut [MaybeUninit<f32>]),
    to_bits: impl Fn(f32) -> u16,
    from_bits: impl Fn(u16) -> f32,
    name: &str,
) {
    let pats = f32_patterns();
    for chunk in pats.chunks(1000) {
        let src: Vec<f32> = chunk.iter().map(|&b| f32::from_bits(b)).collect();
        let mut out = vec![Un(0u16); src.len()];
        store(&src, &mut out);
        for (x, h) in src.iter().zip(&out) {
            let (h, want) = (h.0, to_bits(*x));
            assert!(
                h == want || (x.is_nan() && from_bits(h).is_nan()),
                "{name} store {:#010x}: got {h:#06x} want {want:#06x}",
                x.to_bits()
            );
        }
        let mut back = vec![MaybeUninit::<f32>::uninit(); out.len()];
        load(&out, &mut back);
        for (h, y) in out.iter().zip(&back) {
            // SAFETY: `load` writes every element.
            let y = unsafe { y.assume_init() };
            let h = h.0;
            let want = from_bits(h);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "{name} load {h:#06x}"
            );
        }
    }
}

#[test]
fn bf16_conversion_matches_half() {
    check_conv(
        |s, d| {
            d.iter_mut()
                .zip(s)
                .for_each(|(d, s)| d.0 = narrow::f32_to_bf16(*s))
        },
        |s, d| {
            d.iter_mut()
                .zip(s)
                .for_each(|(d, s)| _ = d.write(narrow::bf16_to_f32(s.0)))
        },
        |x| bf16::from_f32(x).to_bits(),
        |h| bf16::from_bits(h).to_f32(),
        "bf16",
    );
}

#[test]
fn f16_conversion_matches_half() {
    check_conv(
        narrow::F16Base::store,
        narrow::F16Base::load,
        |x| f16::from_f32(x).to_bits(),
        |h| f16::from_bits(h).to_f32(),
        "f16 base",
    );
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        use narrow::f16c;
        check_conv(
            |s, d| {
                for (s, d) in s.chunks(8).zip(d.chunks_mut(8)) {
                    let mut t = [0f32; 8];
                    t[..s.len()].copy_from_slice(s);
                    let mut o = [Un(0u16); 8];
                    // SAFETY: AVX2 and F16C are available (checked above).
                    unsafe { f16c::store8(&mut o, t) };
                    d.copy_from_slice(&o[..d.len()]);
                }
            },
            |s, d| {
                for (s, d) in s.chunks(8).zip(d.chunks_mut(8)) {
                    let mut t = [Un(0u16); 8];
                    t[..s.len()].copy_from_slice(s);
                    // SAFETY: AVX2 and F16C are available (checked above).
                    let v = unsafe { f16c::load8(&t) };
                    d.iter_mut().zip(v).for_each(|(d, v)| _ = d.write(v));
                }
            },
            |x| f16::from_f32(x).to_bits(),
            |h| f16::from_bits(h).to_f32(),
            "f16 f16c",
        );
    }
}

#[test]
fn isa_detection_is_stable() {
    let best = Isa::detect();
    assert!(best.is_available());
    assert_eq!(Isa::detect(), best);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        best == Isa::Avx2,
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
    );
}
