//! Hadar (Sultana et al., IPDPS 2024): online primal-dual scheduling over
//! device types, decided afresh every round.
//!
//! * Utility of giving job j the allocation a (slots per type) for one
//!   round of Δ seconds: the share of its remaining work it gets done,
//!   u_j(a) = min(1, Δ · Σ_k a_k T[j][k] / W_j / R_j).
//! * Dual price of the y-th busy slot of type k, with L and U the lowest
//!   and highest best utility per slot among this round's jobs:
//!   p_k(y) = (L/2) · (2U/L)^(y / C_k). An empty type costs L/2, below
//!   every job's value, a full one costs U, above all of them.
//! * Jobs, by decreasing best utility per slot, each take the allocation
//!   that maximises u_j(a) − Σ_k Σ_{y < a_k} p_k(y_k + y) (the prices rise
//!   as they go), and are admitted when that is positive.
//!
//! Decisions are revisited every round, so slots the prices held back
//! serve no later arrival before the next round; they go, at the end, to
//! jobs not yet admitted: (job, type) pairs by decreasing u_j / W_j on
//! that type (Smith's rule per type), then, to jobs that fit no single
//! type, slots across types. Last, [`exchange`] trades types between jobs
//! where that brings finishes forward ([`finish_gain`]).
//! docs/scheduler.md has the competitive-ratio argument.

use crate::policy::{Decision, Policy, Round, Slots, usable};
use crate::rate;

pub struct Hadar;

impl Policy for Hadar {
    fn name(&self) -> &'static str {
        "hadar"
    }

    fn decide(&mut self, round: &Round<'_>) -> Decision {
        pass(round).decision
    }
}

/// The outcome of Hadar's round, with what HadarE builds on.
pub struct Pass {
    pub decision: Decision,
    /// Slots still free after it.
    pub free: Slots,
    /// Job indices by decreasing best utility per slot.
    pub order: Vec<usize>,
}

/// u_j per slot of each type: Δ T[j][k] / (W_j R_j), uncapped.
fn values(round: &Round<'_>, i: usize) -> Vec<f64> {
    let j = &round.jobs[i];
    let per = round.round_s / (f64::from(j.workers) * j.remaining_steps.max(1e-9));
    j.tput.iter().map(|t| t * per).collect()
}

/// A job's best utility per slot: all workers on its fastest type.
fn density(round: &Round<'_>, i: usize) -> f64 {
    let j = &round.jobs[i];
    let best = j.tput.iter().fold(0.0f64, |m, t| m.max(*t));
    (round.round_s * best / j.remaining_steps.max(1e-9)).min(1.0) / f64::from(j.workers)
}

/// Hadar's round: priced admission, then the held-back slots.
pub fn pass(round: &Round<'_>) -> Pass {
    let n = round.jobs.len();
    let dens: Vec<f64> = (0..n).map(|i| density(round, i)).collect();
    let mut order: Vec<usize> = (0..n).filter(|i| dens[*i] > 0.0).collect();
    order.sort_by(|a, b| {
        dens[*b]
            .total_cmp(&dens[*a])
            .then(
                round.jobs[*a]
                    .arrival_s
                    .total_cmp(&round.jobs[*b].arrival_s),
            )
            .then(round.jobs[*a].id.cmp(&round.jobs[*b].id))
    });
    let upper = order.first().map_or(1.0, |i| dens[*i]);
    let lower = order.last().map_or(1.0, |i| dens[*i]);
    let prices = Prices {
        base: lower / 2.0,
        ratio: 2.0 * upper / lower,
        total: round.total,
    };
    let mut decision = Decision::idle(round);
    let mut free = round.free.to_vec();
    let mut busy: Slots = round
        .total
        .iter()
        .zip(round.free)
        .map(|(t, f)| t - f.min(t))
        .collect();
    let mut waiting = Vec::new();
    for &i in &order {
        let j = &round.jobs[i];
        let v = values(round, i);
        let priced = greedy(&v, j.workers, &free, |k, y| prices.at(k, busy[k] + y));
        let admitted = priced.filter(|(a, cost)| {
            let gain =
                rate::estimate(&j.tput, j.workers, a) * round.round_s / j.remaining_steps.max(1e-9);
            gain.min(1.0) - cost > 0.0
        });
        match admitted {
            Some((a, _)) => take(&mut decision.run[i], &mut free, &mut busy, a),
            None => waiting.push(i),
        }
    }
    // Held-back slots, whole types first: (job, type) pairs by decreasing
    // utility per slot on that type, Smith's rule for the type's queue.
    let mut pairs: Vec<(f64, usize, usize)> = waiting
        .iter()
        .flat_map(|&i| {
            let w = f64::from(round.jobs[i].workers);
            (0..free.len()).map(move |k| (whole_utility(round, i, k) / w, i, k))
        })
        .filter(|(u, _, _)| *u > 0.0)
        .collect();
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (_, i, k) in pairs {
        let w = round.jobs[i].workers;
        if decision.run[i].iter().all(|n| *n == 0) && free[k] >= w {
            let mut a = vec![0; free.len()];
            a[k] = w;
            take(&mut decision.run[i], &mut free, &mut busy, a);
        }
    }
    // Then those that fit no single type, across types.
    for i in waiting {
        let j = &round.jobs[i];
        if decision.run[i].iter().any(|n| *n > 0) {
            continue;
        }
        let v = values(round, i);
        if let Some((a, _)) = greedy(&v, j.workers, &free, |_, _| 0.0) {
            take(&mut decision.run[i], &mut free, &mut busy, a);
        }
    }
    exchange(round, &mut decision.run, &mut free);
    Pass {
        decision,
        free,
        order,
    }
}

/// u_j with all its workers on type k.
fn whole_utility(round: &Round<'_>, i: usize, k: usize) -> f64 {
    let j = &round.jobs[i];
    (round.round_s * j.tput[k] / j.remaining_steps.max(1e-9)).min(1.0)
}

/// What a round with all of job i's workers on type k is worth to the sum
/// of completion times, the exchange's currency: the seconds by which it
/// brings the job's finish forward (against a round without progress),
/// over Δ, weighted by 1 / ln(e + n), n the rounds it still needs on its
/// fastest type. Unfinished, that is its progress in fastest-type seconds,
/// Δ T[j][k] / T_best; finishing at t_f < Δ, it is Δ + R_j / T_best − t_f.
fn finish_gain(round: &Round<'_>, i: usize, k: usize) -> f64 {
    let j = &round.jobs[i];
    let best = j.tput.iter().fold(0.0f64, |m, t| m.max(*t));
    if j.tput[k] <= 0.0 || best <= 0.0 {
        return 0.0;
    }
    let d = round.round_s;
    let left = j.remaining_steps.max(1e-9) / best;
    let saved = if j.remaining_steps > d * j.tput[k] {
        d * j.tput[k] / best
    } else {
        d + left - j.remaining_steps / j.tput[k]
    };
    saved / d / (std::f64::consts::E + left / d).ln()
}

/// The type a job runs on whole, if it runs on one type.
fn whole_type(run: &Slots, workers: u32) -> Option<usize> {
    run.iter().position(|n| *n == workers && workers > 0)
}

/// Raises Σ_j [`finish_gain`] over the jobs that run, after the priced
/// pass, by moves that keep every type's count: the pass hands types out
/// one job at a time against prices that rise as it goes, so an early job
/// may take a fast type it gains little from while a later one, which
/// would gain more, gets a slow one, and slots the prices held back may
/// sit on a type faster than the one a job got. Per pair of types (k, l),
/// a job moves to free slots of l where its gain rises, largest rise
/// first; then, among the jobs of each width on k or l, the ones with the
/// largest gain(l) − gain(k) take l's places (for two types and fixed
/// counts that sort is the optimum). Jobs spanning types stay where they
/// are. A few sweeps over the pairs, each O(n log n).
fn exchange(round: &Round<'_>, run: &mut [Slots], free: &mut [u32]) {
    const SWEEPS: usize = 4;
    let types = free.len();
    let on = |run: &[Slots], i: usize| whole_type(&run[i], round.jobs[i].workers);
    for _ in 0..SWEEPS {
        let mut changed = false;
        for k in 0..types {
            for l in 0..types {
                if k == l {
                    continue;
                }
                // Into l's free slots.
                let mut up: Vec<(f64, usize)> = (0..run.len())
                    .filter(|&i| on(run, i) == Some(k))
                    .map(|i| (finish_gain(round, i, l) - finish_gain(round, i, k), i))
                    .filter(|(gain, _)| *gain > 1e-12)
                    .collect();
                up.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                for (_, i) in up {
                    let w = round.jobs[i].workers;
                    if free[l] >= w {
                        free[l] -= w;
                        free[k] += w;
                        run[i][k] = 0;
                        run[i][l] = w;
                        changed = true;
                    }
                }
                if k > l {
                    continue;
                }
                // Trades between k and l, per width, among the jobs that
                // can run on both.
                let mut group: Vec<(u32, f64, bool, usize)> = (0..run.len())
                    .filter_map(|i| {
                        let t = on(run, i)?;
                        let tput = &round.jobs[i].tput;
                        let both = tput[k] > 0.0 && tput[l] > 0.0;
                        (both && (t == k || t == l)).then(|| {
                            let d = finish_gain(round, i, l) - finish_gain(round, i, k);
                            (round.jobs[i].workers, d, t == k, i)
                        })
                    })
                    .collect();
                // By width, then by gain from l (ties: those already on l first).
                group.sort_by(|a, b| {
                    a.0.cmp(&b.0)
                        .then(b.1.total_cmp(&a.1))
                        .then(a.2.cmp(&b.2))
                        .then(a.3.cmp(&b.3))
                });
                for same in group.chunk_by(|a, b| a.0 == b.0) {
                    let w = same[0].0;
                    let on_l = same.iter().filter(|g| !g.2).count();
                    for (rank, &(_, _, was_k, i)) in same.iter().enumerate() {
                        let to_l = rank < on_l;
                        if to_l == was_k {
                            let (from, to) = if to_l { (k, l) } else { (l, k) };
                            run[i][from] = 0;
                            run[i][to] = w;
                            changed = true;
                        }
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
}

struct Prices<'a> {
    base: f64,
    ratio: f64,
    total: &'a [u32],
}

impl Prices<'_> {
    /// p_k(y).
    fn at(&self, k: usize, y: u32) -> f64 {
        let c = f64::from(self.total[k].max(1));
        self.base * self.ratio.powf(f64::from(y) / c)
    }
}

fn take(run: &mut Slots, free: &mut [u32], busy: &mut [u32], a: Slots) {
    for (k, n) in a.iter().enumerate() {
        free[k] -= n;
        busy[k] += n;
    }
    *run = a;
}

/// The `workers` slots, within `free` and on types of value > 0, that
/// maximise Σ_k (a_k v_k − Σ_{y<a_k} price(k, y)), and their total price;
/// None if they do not fit. One slot at a time to the best marginal type
/// is optimal because every term is concave in a_k (prices only rise).
fn greedy(
    v: &[f64],
    workers: u32,
    free: &[u32],
    price: impl Fn(usize, u32) -> f64,
) -> Option<(Slots, f64)> {
    if usable(v, free) < u64::from(workers) {
        return None;
    }
    let mut a = vec![0u32; v.len()];
    let mut cost = 0.0;
    for _ in 0..workers {
        let mut best: Option<(usize, f64, f64)> = None;
        for k in 0..v.len() {
            if v[k] <= 0.0 || a[k] >= free[k] {
                continue;
            }
            let p = price(k, a[k]);
            if best.is_none_or(|(_, m, _)| v[k] - p > m) {
                best = Some((k, v[k] - p, p));
            }
        }
        let (k, _, p) = best?;
        a[k] += 1;
        cost += p;
    }
    Some((a, cost))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::JobState;

    fn job(id: u64, workers: u32, tput: [f64; 2], remaining: f64) -> JobState {
        JobState {
            id,
            workers,
            tput: tput.to_vec(),
            steps: remaining as u64,
            remaining_steps: remaining,
            arrival_s: 0.0,
            placed: vec![0, 0],
            attained_s: vec![0.0, 0.0],
        }
    }

    #[test]
    fn short_jobs_first_and_each_on_the_type_it_gains_most_from() {
        // a: short, 10× faster on type 0; b: long, only 2× faster there.
        let jobs = [
            job(1, 2, [10.0, 1.0], 1e6),
            job(2, 2, [10.0, 1.0], 100.0),
            job(3, 2, [2.0, 1.0], 1e6),
        ];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[2, 4],
            free: &[2, 4],
            jobs: &jobs,
        };
        let p = pass(&round);
        assert_eq!(
            p.order[0], 1,
            "the job nearest its end has the highest value"
        );
        p.decision.check(&round).expect("within the inventory");
        assert_eq!(
            p.decision.run[1],
            [2, 0],
            "the short job takes the fast type"
        );
        assert_eq!(p.decision.run[0], [0, 2]);
        assert_eq!(p.decision.run[2], [0, 2]);
        assert_eq!(p.free, [0, 0]);
    }

    #[test]
    fn the_type_goes_to_the_job_that_gains_more_from_it() {
        // a comes first (more of its remaining work per slot-round) and
        // would take the fast type, where it is barely faster; b is 10×
        // faster there. Trading places raises u_a + u_b from 2.1e-5 Δ to
        // 2.9e-5 Δ.
        let jobs = [job(1, 1, [2.0, 1.9], 1e5), job(2, 1, [10.0, 1.0], 1e6)];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[1, 1],
            free: &[1, 1],
            jobs: &jobs,
        };
        let p = pass(&round);
        assert_eq!(p.order, [0, 1]);
        p.decision.check(&round).expect("within the inventory");
        assert_eq!(p.decision.run[0], [0, 1]);
        assert_eq!(p.decision.run[1], [1, 0]);
    }

    #[test]
    fn a_job_moves_to_free_slots_of_a_faster_type_and_spans_stay() {
        let jobs = [
            job(1, 2, [4.0, 1.0], 1e5),
            job(2, 2, [4.0, 1.0], 1e5),
            job(3, 2, [4.0, 1.0], 1e5),
        ];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[3, 5],
            free: &[3, 5],
            jobs: &jobs,
        };
        // Job 0 on the slow type with 2 fast slots free: it moves. Job 1
        // spans both types: left alone. Job 2 has nowhere faster to go.
        let mut run = vec![vec![0, 2], vec![1, 1], vec![0, 2]];
        let mut free = vec![2, 0];
        exchange(&round, &mut run, &mut free);
        assert_eq!(run, [vec![2, 0], vec![1, 1], vec![0, 2]]);
        assert_eq!(free, [0, 2]);
    }

    /// The exchange on two one-worker jobs filling one slot of each of two
    /// types, the first on type 0.
    fn exchanged(jobs: &[JobState]) -> Vec<Slots> {
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[1, 1],
            free: &[0, 0],
            jobs,
        };
        let mut run = vec![vec![1, 0], vec![0, 1]];
        let mut free = vec![0, 0];
        exchange(&round, &mut run, &mut free);
        run
    }

    #[test]
    fn no_trade_puts_a_job_on_a_type_it_cannot_run_on() {
        // b would gain far more from type 0 than a (long, so its utility is
        // small anywhere) would lose, but a cannot run on type 1.
        let jobs = [job(1, 1, [2.0, 0.0], 1e7), job(2, 1, [10.0, 1.0], 1e5)];
        assert_eq!(exchanged(&jobs), [vec![1, 0], vec![0, 1]]);
    }

    #[test]
    fn held_back_slots_go_by_smiths_rule_on_each_type() {
        // Type 1 and one slot of type 0 are taken; the price of the other
        // is above both jobs' value, so neither is admitted. Job 0 comes
        // first (by its best type, type 1), but job 1 does more of its
        // remaining work per slot on type 0, and takes it.
        let jobs = [job(1, 1, [1.0, 100.0], 1e7), job(2, 1, [2.0, 0.0], 1e6)];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[2, 1],
            free: &[1, 0],
            jobs: &jobs,
        };
        let p = pass(&round);
        assert_eq!(p.order, [0, 1], "job 0 has the higher best density");
        assert_eq!(p.decision.run[0], [0, 0]);
        assert_eq!(p.decision.run[1], [1, 0]);
    }

    #[test]
    fn a_finishing_job_keeps_the_type_that_finishes_it_far_sooner() {
        // Both gain 10× from type 0. The short one would finish in 10 s
        // there and in 100 s on type 1; the long one gains 54 s of progress
        // in the round. Finishing 90 s sooner is worth more.
        let jobs = [job(1, 1, [10.0, 1.0], 1e6), job(2, 1, [10.0, 1.0], 100.0)];
        assert_eq!(exchanged(&jobs), [vec![0, 1], vec![1, 0]]);
    }

    #[test]
    fn the_fast_type_goes_to_the_larger_speed_up_not_the_shorter_job() {
        // Smith's weights (1/R) would give type 0 to the ten-times shorter
        // job, which barely gains from it; progress weighted by
        // 1/ln(e + rounds left) gives it to the one 10× faster there.
        let jobs = [job(1, 1, [10.0, 9.0], 1e5), job(2, 1, [10.0, 1.0], 1e6)];
        assert_eq!(exchanged(&jobs), [vec![0, 1], vec![1, 0]]);
    }

    #[test]
    fn a_mix_of_types_when_no_single_type_has_room() {
        let jobs = [job(1, 4, [4.0, 2.0], 1e5)];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[2, 2],
            free: &[2, 2],
            jobs: &jobs,
        };
        assert_eq!(pass(&round).decision.run[0], [2, 2]);
    }
}
