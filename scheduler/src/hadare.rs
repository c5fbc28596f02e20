//! HadarE: Hadar, plus copies of jobs on the slots Hadar leaves idle.
//!
//! A job forked into m copies trains them at once on separate data shards;
//! at the round's end their parameters are averaged, weighted by the
//! samples each processed ([`crate::progress::average`]). Averaging is not
//! synchronous SGD, so a sample processed by m copies is worth e(m) of one
//! ([`crate::progress::efficiency`]). A copy is worth adding when it raises
//! the job's utility for the round,
//! min(1, Δ · e(m+1) · (r + r') / R) − min(1, Δ · e(m) · r / R),
//! where r is the job's rate over its m copies so far and r' the new
//! copy's. The slots are ones left after Hadar's pass, where no waiting job
//! fits whole, so they cost nothing this round. Jobs are served in Hadar's
//! order, one copy per job and device type in each pass, as large as the
//! idle slots there allow up to its worker count; passes repeat while one
//! adds a copy, so a type's idle slots may hold several copies of a job,
//! as HadarE forks a job onto every available node.

use crate::hadar;
use crate::policy::{Decision, Fork, Policy, Round};
use crate::progress::efficiency;
use crate::rate;

pub struct HadarE;

impl Policy for HadarE {
    fn name(&self) -> &'static str {
        "hadare"
    }

    fn decide(&mut self, round: &Round<'_>) -> Decision {
        let hadar::Pass {
            mut decision,
            mut free,
            order,
        } = hadar::pass(round);
        // Per job: copies so far (the main one included) and their rate.
        let mut copies: Vec<(usize, f64)> = round
            .jobs
            .iter()
            .zip(&decision.run)
            .map(|(j, a)| {
                let main = rate::estimate(&j.tput, j.workers, a);
                (usize::from(main > 0.0), main)
            })
            .collect();
        // Passes in Hadar's order, one copy per job and type in each, until
        // a pass adds none: each adds a copy or ends, so at most as many
        // passes as idle slots.
        loop {
            let before = decision.forks.len();
            for &i in &order {
                if free.iter().all(|f| *f == 0) {
                    break;
                }
                let j = &round.jobs[i];
                let (mut m, mut total) = copies[i];
                let work = j.remaining_steps.max(1e-9) / round.round_s;
                for (k, (idle, t)) in free.iter_mut().zip(&j.tput).enumerate() {
                    let slots = (*idle).min(j.workers);
                    if slots == 0 || *t <= 0.0 {
                        continue;
                    }
                    let extra = t * f64::from(slots) / f64::from(j.workers);
                    let now = (efficiency(m) * total / work).min(1.0);
                    let with = (efficiency(m + 1) * (total + extra) / work).min(1.0);
                    if with > now {
                        *idle -= slots;
                        decision.forks.push(Fork {
                            job: i,
                            device: k,
                            slots,
                        });
                        m += 1;
                        total += extra;
                    }
                }
                copies[i] = (m, total);
            }
            if decision.forks.len() == before {
                break;
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::JobState;

    #[test]
    fn idle_slots_of_one_type_take_several_copies() {
        let jobs = [JobState {
            id: 1,
            workers: 1,
            tput: vec![10.0],
            steps: 1_000_000,
            remaining_steps: 1e6,
            arrival_s: 0.0,
            placed: vec![0],
            attained_s: vec![0.0],
        }];
        let round = Round {
            now_s: 0.0,
            round_s: 60.0,
            total: &[4],
            free: &[4],
            jobs: &jobs,
        };
        let d = HadarE.decide(&round);
        d.check(&round).expect("within the inventory");
        assert_eq!(d.run[0], [1]);
        assert_eq!(d.forks.len(), 3, "{:?}", d.forks);
        assert!(d.forks.iter().all(|f| f.job == 0 && f.slots == 1));
    }
}
