//! Inputs and checks shared by the all-reduce integration tests.

use gw_allreduce::RedOp;

/// Rank `r`'s element `i` in call `k`: small integers, so float sums are exact.
pub fn input(r: u32, k: usize, i: usize) -> f32 {
    ((r as usize * 7 + k * 3 + i) % 61) as f32
}

pub fn expected(n: u32, k: usize, i: usize) -> f32 {
    (0..n).map(|r| input(r, k, i)).sum()
}

/// Whether `x` is the result of `op` for element `i` of call `k`: sums of
/// small integers are exact, averages within rounding of the division.
pub fn right(op: RedOp, n: u32, k: usize, i: usize, x: f32) -> bool {
    let sum = expected(n, k, i);
    match op {
        RedOp::Avg => (x - sum / n as f32).abs() <= 1e-6 * sum.abs().max(1.0),
        _ => x == sum,
    }
}
