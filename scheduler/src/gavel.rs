//! Gavel (Narayanan et al., OSDI 2020): heterogeneity-aware policies as
//! linear programs over time fractions ([`crate::lp`]), made real one round
//! at a time by its priority mechanism.
//!
//! Each round, job j's priority on type k is X[j][k] divided by the
//! fraction of its life it has so far spent on k; the (job, type) pairs are
//! served in decreasing priority, a job taking all its workers on one type
//! if that type still has room. Over many rounds every job's time on each
//! type thus tracks X. The max-min fairness program depends only on which
//! jobs are present, so it is solved again only when that set changes.

use crate::fifo::arrival_order;
use crate::lp::{self, Fractions};
use crate::policy::{Decision, Policy, Round};

/// Which of Gavel's objectives the LP optimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    MaxMinFairness,
    MinTotalDuration,
}

pub struct Gavel {
    objective: Objective,
    /// The job ids the cached fractions were solved for.
    cache: Option<(Vec<u64>, Fractions)>,
}

impl Gavel {
    pub fn new(objective: Objective) -> Gavel {
        Gavel {
            objective,
            cache: None,
        }
    }

    fn fractions(&mut self, round: &Round<'_>) -> Vec<Vec<f64>> {
        let ids: Vec<u64> = round.jobs.iter().map(|j| j.id).collect();
        if let (Objective::MaxMinFairness, Some((cached, f))) = (self.objective, &self.cache)
            && *cached == ids
        {
            return f.x.clone();
        }
        let tput: Vec<Vec<f64>> = round.jobs.iter().map(|j| j.tput.clone()).collect();
        let workers: Vec<u32> = round.jobs.iter().map(|j| j.workers).collect();
        let scores = match self.objective {
            Objective::MaxMinFairness => lp::fairness_scores(&tput, &workers, round.total),
            Objective::MinTotalDuration => {
                let remaining: Vec<f64> = round.jobs.iter().map(|j| j.remaining_steps).collect();
                lp::duration_scores(&tput, &remaining)
            }
        };
        match lp::max_min(&scores, &workers, round.total) {
            Ok(f) => {
                let x = f.x.clone();
                self.cache = Some((ids, f));
                x
            }
            // A numerical failure must not stop the cluster: fall back to an
            // even split over the types each job can use this round.
            Err(_) => tput
                .iter()
                .zip(&workers)
                .map(|(t, w)| {
                    let ok: Vec<bool> = t
                        .iter()
                        .zip(round.total)
                        .map(|(t, c)| *t > 0.0 && w <= c)
                        .collect();
                    let n = ok.iter().filter(|b| **b).count().max(1) as f64;
                    ok.iter().map(|b| if *b { 1.0 / n } else { 0.0 }).collect()
                })
                .collect(),
        }
    }
}

impl Policy for Gavel {
    fn name(&self) -> &'static str {
        match self.objective {
            Objective::MaxMinFairness => "gavel",
            Objective::MinTotalDuration => "gavel-makespan",
        }
    }

    fn decide(&mut self, round: &Round<'_>) -> Decision {
        let x = self.fractions(round);
        let mut pairs: Vec<(usize, usize, f64)> = Vec::new();
        let rank: Vec<usize> = {
            let mut r = vec![0; round.jobs.len()];
            for (pos, i) in arrival_order(round).into_iter().enumerate() {
                r[i] = pos;
            }
            r
        };
        for (i, j) in round.jobs.iter().enumerate() {
            let age = (round.now_s - j.arrival_s).max(round.round_s);
            for (k, xk) in x[i].iter().enumerate() {
                if *xk > 1e-9 {
                    let received = j.attained_s[k] / age;
                    pairs.push((i, k, xk / (received + 1e-6)));
                }
            }
        }
        pairs.sort_by(|a, b| {
            b.2.total_cmp(&a.2)
                .then(rank[a.0].cmp(&rank[b.0]))
                .then(a.1.cmp(&b.1))
        });
        let mut d = Decision::idle(round);
        let mut free = round.free.to_vec();
        for (i, k, _) in pairs {
            let w = round.jobs[i].workers;
            if d.run[i].iter().all(|n| *n == 0) && free[k] >= w {
                free[k] -= w;
                d.run[i][k] = w;
            }
        }
        d
    }
}
