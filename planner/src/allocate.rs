//! Local batch sizes: how many of a step's samples each rank computes.
//!
//! In synchronous data parallelism every rank waits for the slowest one at
//! the all-reduce, so a step takes `max_i t_i(b_i)` plus the communication
//! that does not overlap. [`plan_optperf`] chooses integer b_i (summing to
//! the global batch, within per-rank bounds) that minimise that maximum;
//! [`plan_even`] is the homogeneous baseline used before any fit exists.
//!
//! # Why taking the smallest "items" is optimal
//!
//! Give every rank its lower bound `lo` first. Each further sample for rank
//! i is an *item* (i, k), k in lo+1..=hi, whose value is the finishing time
//! t_i(k) it causes. Values never decrease in k (a_i ≥ 0 and rounding is
//! monotone), so a plan b is the same thing as choosing, on every rank, a
//! prefix of its items: K = global − n·lo items in all. Its step time is
//! max(base, largest chosen value), with base = max_i t_i(lo).
//!
//! Any K items contain one at least as large as v_K, the K-th smallest value
//! among all items, so no plan beats max(base, v_K). The plan built here
//! takes every item with value below v_K (fewer than K of them, all
//! prefixes) and then the missing ones among items equal to v_K (on each
//! rank they directly follow that prefix), so it reaches the bound: it is
//! optimal. This is the greedy "next sample to the rank that would finish
//! soonest", done in bulk instead of one heap pop per sample.
//!
//! # Finding v_K fast
//!
//! count(T) = Σ_i (cap_i(T) − lo), where cap_i(T) is the largest k ≤ hi with
//! t_i(k) ≤ T, counts the items of value ≤ T, and v_K is the smallest T with
//! count(T) ≥ K. cap_i(T) starts from the inverse floor((T − c_i)/a_i) and is
//! corrected by evaluating t_i itself, so the division's rounding cannot
//! disagree with the values that define optimality.
//!
//! The search keeps a bracket (T_lo, T_hi] with count(T_lo) < K ≤
//! count(T_hi). Where few ranks sit at a bound, count is nearly linear in
//! T, so each probe interpolates it and aims n/2 items past the K-th, first
//! above, then below: usually two or three passes close the bracket (the
//! first guess comes from the continuous solution Σ (T − c_i)/a_i = global).
//! When a pair of aimed probes fails to halve the bracket, it is split
//! instead — on the bit pattern of the floats while the ends differ by more
//! than 2×, arithmetically after — so at most ~120 splits (64 on the bit
//! pattern, 53 on the value) reach adjacent floats, and even adversarial
//! models need at most a few hundred passes. Ranks whose cap is the same at both ends
//! drop out, so later passes touch fewer ranks. Once at most 2n + 64 items
//! lie inside, they are listed and v_K is picked by selection; if instead
//! the ends become adjacent floats, every item inside equals T_hi. Each
//! pass is O(n); 100,000 heterogeneous ranks plan in 10–20 ms (see
//! benches/plan.rs).

//! # Ties
//!
//! Several ranks may offer items of value exactly v_K (identical models, or
//! a_i = 0 ranks whose every sample is "free"). The samples still missing
//! are spread evenly over those ranks, the remainder going to the lowest
//! ranks. Everything is integer arithmetic or IEEE operations in rank
//! order, so the same input gives the same plan on every machine.

use crate::error::{PlanError, check_shape};
use crate::model::Linear;

/// Equal shares of `global` over `workers`, the remainder one each to the
/// lowest ranks. The bounds only need checking: when `workers × lo ≤ global
/// ≤ workers × hi` the shares ⌊global/n⌋ and ⌈global/n⌉ lie within them.
pub fn plan_even(workers: usize, global: u64, lo: u64, hi: u64) -> Result<Vec<u64>, PlanError> {
    check_shape(workers, global, lo, hi)?;
    let n = workers as u64;
    let share = global / n;
    let extra = global % n;
    Ok((0..n).map(|i| share + u64::from(i < extra)).collect())
}

/// Integer local batches summing to `global`, each in `[lo, hi]`, that
/// minimise the slowest rank's predicted compute time `max_i t_i(b_i)`.
/// See the module comment for why the result is optimal.
pub fn plan_optperf(
    models: &[Linear],
    global: u64,
    lo: u64,
    hi: u64,
) -> Result<Vec<u64>, PlanError> {
    check_shape(models.len(), global, lo, hi)?;
    for (rank, m) in models.iter().enumerate() {
        m.validate(rank)?;
    }
    Ok(optimal(models, global, lo, hi))
}

/// A rank whose cap still differs between the two ends of the bracket.
/// Kept in one contiguous array that shrinks as ranks settle, so late
/// passes stream over few, nearby entries.
struct Live {
    rank: usize,
    model: Linear,
    /// Cap at the low end, at the high end and at the current probe.
    below: u64,
    above: u64,
    probe: u64,
}

/// One end of the bracket (low.t, high.t] around v_K, with the number of
/// items at or below it: `low.count < K ≤ high.count`.
struct End {
    t: f64,
    count: u128,
}

/// The optimal plan for validated models and a feasible request.
fn optimal(models: &[Linear], global: u64, lo: u64, hi: u64) -> Vec<u64> {
    let n = models.len();
    // u128: n × (hi − lo) items can exceed u64 even though global cannot.
    let wanted = global as u128 - n as u128 * lo as u128;
    if wanted == 0 {
        return vec![lo; n];
    }
    // Feasibility gives wanted ≤ n·(hi − lo), so hi > lo here.
    let mut top = 0.0f64;
    // The smallest positive item value: no item lies in (0, first), so
    // splitting there would waste passes (a bit-pattern midpoint of 0 and
    // 1.0 is about 1e-154).
    let mut first = f64::INFINITY;
    // Whether any item costs nothing at all; if none does, count(0) = 0 and
    // the search can start there instead of probing it.
    let mut free = false;
    // Σ 1/a_i and Σ c_i/a_i: ignoring bounds, Σ (T − c_i)/a_i = global
    // puts T at (global + Σ c_i/a_i) / Σ 1/a_i, the first probe's guess.
    let (mut speed, mut offset) = (0.0f64, 0.0f64);
    let mut live: Vec<Live> = Vec::with_capacity(n);
    for (rank, m) in models.iter().enumerate() {
        // +0.0 turns -0.0 into 0.0: one representation of "no cost".
        let model = Linear {
            a: m.a + 0.0,
            c: m.c + 0.0,
        };
        top = top.max(model.time(hi));
        let cheapest = model.time(lo + 1);
        if cheapest > 0.0 {
            first = first.min(cheapest);
        } else {
            free = true;
        }
        if model.a > 0.0 {
            speed += 1.0 / model.a;
            offset += model.c / model.a;
        }
        live.push(Live {
            rank,
            model,
            below: lo,
            above: hi,
            probe: lo,
        });
    }
    let mut low = End {
        t: if free { -1.0 } else { 0.0 },
        count: 0,
    };
    let mut high = End {
        t: top,
        count: n as u128 * (hi - lo) as u128,
    };
    // Ranks that settle (same cap at both ends) leave `live` with their
    // final cap written here.
    let mut plan = vec![lo; n];
    let budget = 2 * n as u128 + 64;
    let margin = n as u128 / 2 + 16;
    // Probes alternate between aiming just above and just below the K-th
    // item; `bisect` forces a plain split when aiming stopped paying.
    let mut aim_high = true;
    let mut bisect = false;
    let mut last_gap = high.count - low.count;
    // Aimed just above the guess, as the alternation expects first.
    let mut hint = (speed > 0.0).then(|| (global as f64 + offset + margin as f64) / speed);

    loop {
        if high.count - low.count <= budget {
            take_smallest(&live, wanted - low.count, &mut plan);
            return plan;
        }
        let guess = hint.take().filter(|&t| low.t < t && t < high.t);
        let aim = Aim {
            wanted,
            margin,
            high: aim_high,
            bisect,
            first,
        };
        let Some(mid) = guess.or_else(|| probe(&low, &high, &aim)) else {
            // No float lies strictly inside: every item in (low.t, high.t]
            // has the value high.t, so that is v_K and all of them tie.
            let ties: Vec<(usize, u64)> =
                live.iter().map(|r| (r.rank, r.above - r.below)).collect();
            for r in &live {
                plan[r.rank] = r.below;
            }
            share_ties(&mut plan, &ties, wanted - low.count);
            return plan;
        };
        let mut count = low.count;
        for r in live.iter_mut() {
            r.probe = cap_between(&r.model, mid, r.below, r.above);
            count += (r.probe - r.below) as u128;
        }
        let up = count >= wanted;
        let end = if up { &mut high } else { &mut low };
        end.t = mid;
        end.count = count;
        live.retain_mut(|r| {
            if up {
                r.above = r.probe;
            } else {
                r.below = r.probe;
            }
            if r.below == r.above {
                plan[r.rank] = r.below;
                return false;
            }
            true
        });
        // Aimed probes should close the bracket in two; if a pair of them
        // did not even halve it, the count is far from linear here.
        if !aim_high {
            let gap = high.count - low.count;
            bisect = gap > last_gap / 2;
            last_gap = gap;
        }
        aim_high = !aim_high;
    }
}

/// Finishes a plan when few items remain inside the bracket: lists their
/// values, finds v_K as the `rank`-th smallest (1-based), and gives every
/// live rank its items below v_K plus a fair share of those equal to it.
fn take_smallest(live: &[Live], rank: u128, plan: &mut [u64]) {
    let mut values = Vec::new();
    for r in live {
        values.extend((r.below + 1..=r.above).map(|k| r.model.time(k)));
    }
    // 1 ≤ rank ≤ values.len() by the bracket's invariant.
    let (_, kth, _) = values.select_nth_unstable_by(rank as usize - 1, f64::total_cmp);
    let threshold = *kth;
    let mut taken = 0u128;
    let mut ties = Vec::new();
    for r in live {
        // Values rise with k: first those below the threshold, then ties.
        let mut k = r.below;
        while k < r.above && r.model.time(k + 1) < threshold {
            k += 1;
        }
        let strict = k;
        while k < r.above && r.model.time(k + 1) <= threshold {
            k += 1;
        }
        taken += (strict - r.below) as u128;
        plan[r.rank] = strict;
        if k > strict {
            ties.push((r.rank, k - strict));
        }
    }
    share_ties(plan, &ties, rank - taken);
}

/// What the next probe aims for.
struct Aim {
    /// K, the number of items the plan takes.
    wanted: u128,
    /// How many items past the K-th an aimed probe tries to land.
    margin: u128,
    /// Aim above the K-th item (else below).
    high: bool,
    /// Split the bracket instead of aiming.
    bisect: bool,
    /// The smallest positive item value.
    first: f64,
}

/// The next time to count at, strictly inside the bracket; None when no
/// item value other than `high.t` lies inside.
///
/// Counts grow almost linearly in T wherever few ranks sit at a bound, so
/// interpolating the count usually lands within a few items of the K-th:
/// the probe aims `margin` items past it on one side, and the next probe on
/// the other, closing the bracket in two passes. Where that fails (or
/// `bisect` asks) the bracket is split instead.
fn probe(low: &End, high: &End, aim: &Aim) -> Option<f64> {
    // Times are ≥ 0, so from a negative end the next probe is 0, which
    // separates the items that cost nothing; nothing lies in (low.t, 0).
    if low.t < 0.0 {
        return (high.t > 0.0).then_some(0.0);
    }
    // Nothing lies in (0, first) either: split from just below `first`.
    let left = if low.t < aim.first {
        below(aim.first)
    } else {
        low.t
    };
    if left >= high.t {
        return None;
    }
    if !aim.bisect {
        let target = if aim.high {
            aim.wanted + aim.margin
        } else {
            aim.wanted.saturating_sub(aim.margin + 1)
        };
        let frac = (target.max(low.count) - low.count) as f64 / (high.count - low.count) as f64;
        let t = left + frac * (high.t - left);
        if left < t && t < high.t {
            return Some(t);
        }
    }
    split(left, high.t)
}

/// A float strictly between `lo` ≥ 0 and `hi`, or None when they are
/// adjacent.
fn split(lo: f64, hi: f64) -> Option<f64> {
    // Far apart (or hi infinite): halve the bit pattern, which for
    // non-negative floats is monotone and reaches adjacency in ≤ 64 steps.
    // Close together: halve the value, as exact as floats allow.
    let mid = if hi.is_finite() && hi <= 2.0 * lo {
        lo + (hi - lo) / 2.0
    } else {
        f64::from_bits(lo.to_bits() / 2 + hi.to_bits() / 2 + (lo.to_bits() & hi.to_bits() & 1))
    };
    (lo < mid && mid < hi).then_some(mid)
}

/// The largest float below `t` > 0.
fn below(t: f64) -> f64 {
    if t.is_infinite() {
        f64::MAX
    } else {
        f64::from_bits(t.to_bits() - 1)
    }
}

/// The largest k in `[from, to]` with k = from or t(k) ≤ `limit`.
///
/// The caller guarantees the answer lies in the range. The inverse of the
/// model gives a guess that is usually exact; galloping away from it and a
/// binary search correct it using t itself, so the result is exactly what
/// comparing rounded times would give.
fn cap_between(m: &Linear, limit: f64, from: u64, to: u64) -> u64 {
    if from >= to {
        return from;
    }
    let fits = |k: u64| m.time(k) <= limit;
    let guess = if m.a > 0.0 {
        let g = (limit - m.c) / m.a;
        if g.is_nan() || g <= from as f64 {
            from
        } else if g >= to as f64 {
            to
        } else {
            g as u64
        }
    } else if m.c <= limit {
        to
    } else {
        from
    };

    // Narrow to [lo, hi] holding the answer, with lo known to qualify.
    let (mut lo, mut hi);
    if guess == from || fits(guess) {
        lo = guess;
        hi = to;
        let mut step = 1u64;
        while let Some(probe) = lo.checked_add(step).filter(|&p| p <= hi) {
            if fits(probe) {
                lo = probe;
                step = step.saturating_mul(2);
            } else {
                hi = probe - 1;
                break;
            }
        }
    } else {
        hi = guess - 1;
        lo = from;
        let mut step = 1u64;
        while hi - from >= step {
            let probe = hi + 1 - step;
            if fits(probe) {
                lo = probe;
                break;
            }
            hi = probe - 1;
            step = step.saturating_mul(2);
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Hands `rest` samples to the tied ranks `(rank, available)` (in rank
/// order): every rank up to a common level, capped by what it has, then one
/// more each to the lowest ranks that still have room.
fn share_ties(plan: &mut [u64], ties: &[(usize, u64)], rest: u128) {
    if rest == 0 {
        return;
    }
    let mut order: Vec<usize> = (0..ties.len()).collect();
    order.sort_unstable_by_key(|&j| (ties[j].1, j));
    // Walk up from the smallest capacity: a rank whose capacity fits under
    // an even split of what is left is filled; the first that does not fix
    // the level for it and all larger ones.
    let mut left = rest;
    let mut level = u64::MAX;
    for (pos, &j) in order.iter().enumerate() {
        let ranks = (order.len() - pos) as u128;
        let room = ties[j].1 as u128;
        if room * ranks <= left {
            left -= room;
        } else {
            level = (left / ranks) as u64;
            left %= ranks;
            break;
        }
    }
    for &(i, room) in ties {
        let mut give = room.min(level);
        if left > 0 && room > level {
            give += 1;
            left -= 1;
        }
        plan[i] += give;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_between_matches_a_linear_scan() {
        let models = [
            Linear { a: 0.1, c: 0.3 },
            Linear { a: 1e-9, c: 1.0 },
            Linear { a: 0.0, c: 0.5 },
            Linear { a: 3.0, c: 0.0 },
        ];
        for m in &models {
            for &limit in &[-1.0, 0.0, 0.3, 0.5, 0.7, 1.0, 1.0 + 5e-9, 2.9, 3.0, 60.0] {
                for from in 0..6u64 {
                    for to in from..30u64 {
                        let expect = (from..=to)
                            .filter(|&k| k == from || m.time(k) <= limit)
                            .max()
                            .unwrap_or(from);
                        assert_eq!(
                            cap_between(m, limit, from, to),
                            expect,
                            "{m:?} {limit} {from} {to}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn cap_between_handles_huge_ranges() {
        let m = Linear { a: 1e-12, c: 2.0 };
        let k = cap_between(&m, 3.0, 0, u64::MAX);
        assert!(m.time(k) <= 3.0);
        assert!(k == u64::MAX || m.time(k + 1) > 3.0);
    }

    #[test]
    fn split_stays_inside_and_ends_at_adjacent_floats() {
        let mut lo = 0.0f64;
        let mut hi = f64::INFINITY;
        let mut steps = 0;
        while let Some(mid) = split(lo, hi) {
            assert!(lo < mid && mid < hi);
            if mid > 0.37 {
                hi = mid;
            } else {
                lo = mid;
            }
            steps += 1;
            assert!(steps < 200);
        }
        assert_eq!(f64::from_bits(lo.to_bits() + 1), hi);
    }

    #[test]
    fn ties_are_spread_evenly_within_capacity() {
        let mut plan = vec![0; 4];
        share_ties(&mut plan, &[(0, 10), (1, 1), (2, 10), (3, 10)], 12);
        assert_eq!(plan, vec![4, 1, 4, 3]);
        let mut plan = vec![0; 3];
        share_ties(&mut plan, &[(0, 2), (1, 2), (2, 2)], 6);
        assert_eq!(plan, vec![2, 2, 2]);
    }
}
