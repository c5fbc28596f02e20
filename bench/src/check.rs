//! Input patterns and expected results for `-c 1`.
//!
//! Every rank fills its input with small integers that depend on the rank and
//! the element's index, chosen so that the reduction of any subset of ranks,
//! in any order and grouping, is exactly representable in every datatype:
//!
//! - sum, avg, min, max and the collectives without a reduction use values in
//!   `0..span`, where `span · n` stays within the range in which the type holds
//!   every integer (2^8 for bfloat16, 2^11 for half): partial sums are then
//!   exact whatever order the algorithm adds in. Integer types wrap, and
//!   wrapping addition is associative, so they need no such bound.
//! - prod uses values in {1, 2}: every partial product is a power of two, exact
//!   in every floating-point type (until it overflows to inf, which then does
//!   so in every order), and wrapping (u8: 2^8 = 0) in the integer types.
//!
//! The expected value is computed from the exact (i64 wrapping, or f64) result
//! and converted once to the type; avg is the exact sum divided by n in f64,
//! rounded once to the type, which is what the library's sum-then-divide
//! produces (its f32 division is correctly rounded, and rounding the f32
//! quotient again to half or bfloat16 is innocuous).

use gw_collectives::{DType, Element, RedOp};
use half::{bf16, f16};
use std::fmt::Debug;

/// An element type gwbench can fill and check.
pub trait Value: Element + PartialEq + Debug {
    /// The type's value for an exactly known result: `wrapped` is the result
    /// in two's-complement i64 arithmetic (integer types truncate it, which
    /// is their own wrapping arithmetic), `real` the same result as an f64
    /// (exact for the patterns here; floating-point types round it once).
    fn from_exact(wrapped: i64, real: f64) -> Self;
}

impl Value for u8 {
    fn from_exact(wrapped: i64, _: f64) -> Self {
        wrapped as u8
    }
}

impl Value for i32 {
    fn from_exact(wrapped: i64, _: f64) -> Self {
        wrapped as i32
    }
}

impl Value for i64 {
    fn from_exact(wrapped: i64, _: f64) -> Self {
        wrapped
    }
}

impl Value for f16 {
    fn from_exact(_: i64, real: f64) -> Self {
        f16::from_f64(real)
    }
}

impl Value for bf16 {
    fn from_exact(_: i64, real: f64) -> Self {
        bf16::from_f64(real)
    }
}

impl Value for f32 {
    fn from_exact(_: i64, real: f64) -> Self {
        real as f32
    }
}

impl Value for f64 {
    fn from_exact(_: i64, real: f64) -> Self {
        real
    }
}

/// The largest integer magnitude below which every integer is exact in `dtype`
/// (for integer types: a bound that never limits the patterns).
fn exact_limit(dtype: DType) -> u64 {
    match dtype {
        DType::Bf16 => 1 << 8,
        DType::F16 => 1 << 11,
        DType::F32 => 1 << 24,
        _ => 1 << 53,
    }
}

/// What every rank puts in its input for one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// The reduction (`RedOp::None` for all-gather and broadcast).
    pub op: RedOp,
    /// World size.
    pub n: u32,
    /// Values (except prod's) lie in `0..span`.
    pub span: u64,
}

impl Pattern {
    pub fn new(dtype: DType, op: RedOp, n: u32) -> Pattern {
        let span = (exact_limit(dtype) / u64::from(n.max(1))).clamp(2, 32);
        Pattern { op, n, span }
    }

    /// The input of `rank` at index `j` of its send buffer.
    pub fn value(&self, rank: u32, j: usize) -> i64 {
        let (r, j) = (u64::from(rank), j as u64);
        if self.op == RedOp::Prod {
            1 + i64::from(r.wrapping_mul(5).wrapping_add(j).wrapping_add(j >> 4) % 3 == 0)
        } else {
            (r.wrapping_mul(13)
                .wrapping_add(j.wrapping_mul(7))
                .wrapping_add(j >> 5)
                % self.span) as i64
        }
    }

    /// [`Pattern::value`] in the element type.
    pub fn input<T: Value>(&self, rank: u32, j: usize) -> T {
        let v = self.value(rank, j);
        T::from_exact(v, v as f64)
    }

    /// The reduction over all ranks of their inputs at index `j`.
    pub fn reduced<T: Value>(&self, j: usize) -> T {
        reduce_exact(self.op, self.n, (0..self.n).map(|r| self.value(r, j)))
    }
}

/// The exact result of reducing `vals` (one per rank, `n` ranks) with `op`,
/// converted once to `T`.
pub fn reduce_exact<T: Value>(op: RedOp, n: u32, vals: impl IntoIterator<Item = i64>) -> T {
    let mut it = vals.into_iter();
    let Some(first) = it.next() else {
        return T::from_exact(0, 0.0);
    };
    let (mut w, mut f) = (first, first as f64);
    for v in it {
        match op {
            RedOp::Sum | RedOp::Avg => {
                w = w.wrapping_add(v);
                f += v as f64;
            }
            RedOp::Prod => {
                w = w.wrapping_mul(v);
                f *= v as f64;
            }
            RedOp::Min => {
                w = w.min(v);
                f = f.min(v as f64);
            }
            RedOp::Max => {
                w = w.max(v);
                f = f.max(v as f64);
            }
            RedOp::None => {}
        }
    }
    if op == RedOp::Avg {
        f /= f64::from(n);
    }
    T::from_exact(w, f)
}

/// Elements of `got` that differ from `want(i)`.
pub fn count_wrong<T: Value>(got: &[T], want: impl Fn(usize) -> T) -> u64 {
    got.iter()
        .enumerate()
        .filter(|&(i, g)| *g != want(i))
        .count() as u64
}

/// Fills `buf` with a value no check ever expects (all bits set: NaN in the
/// floating-point types; -1 or 255 in the integer types, which the patterns
/// never produce), so that an element the collective did not write is wrong.
pub fn poison<T: Value>(buf: &mut [T]) {
    // SAFETY: `Element` types accept every bit pattern, and the pointer covers
    // exactly `buf`'s bytes.
    unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), 0xff, buf.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reduction step carried out in the type's own arithmetic, as the
    /// library's kernels do it (half and bfloat16 in f32, rounded once).
    trait Arith: Value {
        fn step(a: Self, b: Self, op: RedOp) -> Self;
        /// avg's final step on a complete sum.
        fn divide(sum: Self, n: u32) -> Self;
    }

    macro_rules! int_arith {
        ($t:ty) => {
            impl Arith for $t {
                fn step(a: Self, b: Self, op: RedOp) -> Self {
                    match op {
                        RedOp::Sum => a.wrapping_add(b),
                        RedOp::Prod => a.wrapping_mul(b),
                        RedOp::Min => a.min(b),
                        RedOp::Max => a.max(b),
                        _ => unreachable!(),
                    }
                }
                fn divide(_: Self, _: u32) -> Self {
                    unreachable!("integer avg is refused")
                }
            }
        };
    }
    int_arith!(u8);
    int_arith!(i32);
    int_arith!(i64);

    macro_rules! float_arith {
        ($t:ty, $w:ty, $to:expr, $from:expr) => {
            impl Arith for $t {
                fn step(a: Self, b: Self, op: RedOp) -> Self {
                    let (a, b): ($w, $w) = ($to(a), $to(b));
                    $from(match op {
                        RedOp::Sum | RedOp::Avg => a + b,
                        RedOp::Prod => a * b,
                        RedOp::Min => a.min(b),
                        RedOp::Max => a.max(b),
                        RedOp::None => unreachable!(),
                    })
                }
                fn divide(sum: Self, n: u32) -> Self {
                    $from($to(sum) / n as $w)
                }
            }
        };
    }
    float_arith!(f16, f32, f16::to_f32, f16::from_f32);
    float_arith!(bf16, f32, bf16::to_f32, bf16::from_f32);
    float_arith!(f32, f32, |x| x, |x| x);
    float_arith!(f64, f64, |x| x, |x| x);

    /// Reduces in the type's arithmetic in the given order and grouping.
    fn fold<T: Arith>(op: RedOp, xs: &[T], order: &Order) -> T {
        let step = if op == RedOp::Avg { RedOp::Sum } else { op };
        let sum = match order {
            Order::Left => xs.iter().copied().reduce(|a, b| T::step(a, b, step)),
            Order::Right => xs.iter().rev().copied().reduce(|a, b| T::step(b, a, step)),
            Order::Rotated(k) => {
                let k = k % xs.len();
                xs[k..]
                    .iter()
                    .chain(&xs[..k])
                    .copied()
                    .reduce(|a, b| T::step(a, b, step))
            }
            Order::Tree => Some(tree(xs, step)),
        }
        .unwrap();
        if op == RedOp::Avg {
            T::divide(sum, xs.len() as u32)
        } else {
            sum
        }
    }

    fn tree<T: Arith>(xs: &[T], op: RedOp) -> T {
        if xs.len() == 1 {
            return xs[0];
        }
        let (a, b) = xs.split_at(xs.len() / 2);
        T::step(tree(a, op), tree(b, op), op)
    }

    enum Order {
        Left,
        Right,
        Rotated(usize),
        Tree,
    }

    /// Brute force: every op, every n ≤ 8, several orders, many indices.
    fn agrees_with_brute_force<T: Arith>(dtype: DType) {
        for op in RedOp::ALL {
            if op == RedOp::Avg && !dtype.is_float() {
                continue;
            }
            for n in 1..=8u32 {
                let p = Pattern::new(dtype, op, n);
                for j in (0..3000).chain([1 << 20, (1 << 24) + 7, usize::MAX / 3]) {
                    let xs: Vec<T> = (0..n).map(|r| p.input::<T>(r, j)).collect();
                    let want: T = p.reduced(j);
                    let mut orders = vec![Order::Left, Order::Right, Order::Tree];
                    orders.extend((1..n as usize).map(Order::Rotated));
                    for order in &orders {
                        let got = fold(op, &xs, order);
                        assert_eq!(
                            got,
                            want,
                            "{} {} n={n} j={j} inputs {xs:?}",
                            dtype.name(),
                            op.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn expected_values_match_brute_force() {
        agrees_with_brute_force::<f32>(DType::F32);
        agrees_with_brute_force::<f64>(DType::F64);
        agrees_with_brute_force::<f16>(DType::F16);
        agrees_with_brute_force::<bf16>(DType::Bf16);
        agrees_with_brute_force::<i32>(DType::I32);
        agrees_with_brute_force::<i64>(DType::I64);
        agrees_with_brute_force::<u8>(DType::U8);
    }

    #[test]
    fn wrapping_is_exercised() {
        // u8 products of eight 2s wrap to 0; the expected value must wrap too.
        assert_eq!(reduce_exact::<u8>(RedOp::Prod, 8, [2; 8]), 0);
        assert_eq!(
            reduce_exact::<u8>(RedOp::Sum, 9, [31; 9]),
            (31 * 9 % 256) as u8
        );
        assert_eq!(reduce_exact::<i32>(RedOp::Prod, 32, [2; 32]), 0);
        // ...while floats hold them exactly.
        assert_eq!(
            reduce_exact::<bf16>(RedOp::Prod, 8, [2; 8]),
            bf16::from_f32(256.0)
        );
        assert_eq!(
            reduce_exact::<f16>(RedOp::Avg, 3, [1, 0, 0]),
            f16::from_f64(1.0 / 3.0)
        );
    }

    #[test]
    fn patterns_depend_on_rank_and_index_and_stay_in_range() {
        for dtype in DType::ALL {
            for op in RedOp::ALL {
                for n in [1u32, 2, 3, 8, 64, 1000] {
                    let p = Pattern::new(dtype, op, n);
                    assert!(p.span >= 2);
                    if dtype == DType::Bf16 && n <= 128 {
                        assert!((p.span - 1) * u64::from(n) <= 256, "{p:?}");
                    }
                    let vals: Vec<i64> = (0..64).map(|j| p.value(0, j)).collect();
                    assert!(vals.iter().all(|&v| (0..32).contains(&v)));
                    assert!(
                        vals.windows(2).any(|w| w[0] != w[1]),
                        "constant over j: {p:?}"
                    );
                    if n > 1 {
                        assert!(
                            (0..64).any(|j| p.value(0, j) != p.value(1, j)),
                            "rank-blind: {p:?}"
                        );
                    }
                    if op == RedOp::Prod {
                        assert!(vals.iter().all(|&v| v == 1 || v == 2));
                    }
                }
            }
        }
        // Eight ranks' sums in bfloat16 stay below 2^8.
        assert_eq!(Pattern::new(DType::Bf16, RedOp::Sum, 8).span, 32);
        assert_eq!(Pattern::new(DType::Bf16, RedOp::Sum, 16).span, 16);
    }

    #[test]
    fn poison_is_never_expected() {
        fn check<T: Value>(dtype: DType) {
            let mut b = [T::from_exact(0, 0.0); 4];
            poison(&mut b);
            for op in RedOp::ALL {
                for n in 1..=8 {
                    let p = Pattern::new(dtype, op, n);
                    for j in 0..500 {
                        assert!(p.reduced::<T>(j) != b[0]);
                        assert!(p.input::<T>(n - 1, j) != b[0]);
                    }
                }
            }
            assert_eq!(count_wrong(&b, |_| T::from_exact(0, 0.0)), 4);
        }
        check::<f32>(DType::F32);
        check::<f64>(DType::F64);
        check::<f16>(DType::F16);
        check::<bf16>(DType::Bf16);
        check::<i32>(DType::I32);
        check::<i64>(DType::I64);
        check::<u8>(DType::U8);
    }

    #[test]
    fn count_wrong_counts() {
        let got = [1.0f32, 2.0, f32::NAN, 4.0];
        assert_eq!(count_wrong(&got, |i| (i + 1) as f32), 1);
        assert_eq!(count_wrong(&got, |_| 0.0), 4);
    }
}
