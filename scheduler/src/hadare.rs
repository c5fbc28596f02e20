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
//! fits whole, so they cost nothing this round. Jobs are served in Hadar's order, each
//! getting at most one copy per device type, as large as the idle slots
//! there allow up to its worker count.

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
        for i in order {
            if free.iter().all(|f| *f == 0) {
                break;
            }
            let j = &round.jobs[i];
            let main = rate::estimate(&j.tput, j.workers, &decision.run[i]);
            let mut copies = usize::from(main > 0.0);
            let mut total = main;
            let work = j.remaining_steps.max(1e-9) / round.round_s;
            for (k, (idle, t)) in free.iter_mut().zip(&j.tput).enumerate() {
                let slots = (*idle).min(j.workers);
                if slots == 0 || *t <= 0.0 {
                    continue;
                }
                let extra = t * f64::from(slots) / f64::from(j.workers);
                let before = (efficiency(copies) * total / work).min(1.0);
                let after = (efficiency(copies + 1) * (total + extra) / work).min(1.0);
                if after > before {
                    *idle -= slots;
                    decision.forks.push(Fork {
                        job: i,
                        device: k,
                        slots,
                    });
                    copies += 1;
                    total += extra;
                }
            }
        }
        decision
    }
}
