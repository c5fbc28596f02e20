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
    Pass {
        decision,
        free,
        order,
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
