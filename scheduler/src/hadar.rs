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
//! jobs not yet admitted, in the same order, on their fastest free types.
//! Last, [`exchange`] trades types between jobs where that raises Σ u_j.
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
    for i in waiting {
        let j = &round.jobs[i];
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

/// The type a job runs on whole, if it runs on one type.
fn whole_type(run: &Slots, workers: u32) -> Option<usize> {
    run.iter().position(|n| *n == workers && workers > 0)
}

/// Raises the round's primal, Σ_j u_j, after the priced pass, by moves
/// that keep every type's count: the pass hands types out one job at a
/// time against prices that rise as it goes, so an early job may take a
/// fast type it gains little from while a later one, which would gain
/// more, gets a slow one, and slots the prices held back may sit on a
/// type faster than the one a job got. Per pair of types (k, l), a job
/// moves to free slots of l where u_j rises, largest rise first; then,
/// among the jobs of each width on k or l, the ones with the largest
/// u_j(l) − u_j(k) take l's places (for two types and fixed counts that
/// sort is the optimum). Jobs spanning types stay where they are. A few
/// sweeps over the pairs, each O(n log n).
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
                    .map(|i| (whole_utility(round, i, l) - whole_utility(round, i, k), i))
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
                            let d = whole_utility(round, i, l) - whole_utility(round, i, k);
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

    #[test]
    fn no_trade_puts_a_job_on_a_type_it_cannot_run_on() {
        // b would gain far more from type 0 than a (long, so its utility is
        // small anywhere) would lose, but a cannot run on type 1.
        let jobs = [job(1, 1, [2.0, 0.0], 1e7), job(2, 1, [10.0, 1.0], 1e5)];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[1, 1],
            free: &[0, 0],
            jobs: &jobs,
        };
        let mut run = vec![vec![1, 0], vec![0, 1]];
        let mut free = vec![0, 0];
        exchange(&round, &mut run, &mut free);
        assert_eq!(run, [vec![1, 0], vec![0, 1]]);
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
