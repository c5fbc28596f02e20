//! First come, first served, blind to device types: the YARN-style
//! baseline. A running job keeps its slots until it ends (no preemption);
//! the oldest waiting job takes the first type, in cluster order, with room
//! for all its workers, and while it cannot start nobody behind it starts
//! either. The only thing it knows about types is where a job does not fit
//! at all (throughput 0), as a real cluster learns from the job failing.

use crate::policy::{Decision, Policy, Round};

pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn decide(&mut self, round: &Round<'_>) -> Decision {
        let mut d = Decision::idle(round);
        let mut free = round.free.to_vec();
        for (i, j) in round.jobs.iter().enumerate() {
            let sum: u32 = j.placed.iter().sum();
            let fits = (0..free.len())
                .all(|k| j.placed[k] <= free[k] && (j.placed[k] == 0 || j.tput[k] > 0.0));
            if sum == j.workers && fits {
                for (f, n) in free.iter_mut().zip(&j.placed) {
                    *f -= n;
                }
                d.run[i] = j.placed.clone();
            }
        }
        for i in arrival_order(round) {
            let j = &round.jobs[i];
            if d.run[i].iter().any(|n| *n > 0) {
                continue;
            }
            let Some(k) = (0..free.len()).find(|k| j.tput[*k] > 0.0 && free[*k] >= j.workers)
            else {
                break;
            };
            free[k] -= j.workers;
            d.run[i][k] = j.workers;
        }
        d
    }
}

/// Job indices by arrival, then id.
pub(crate) fn arrival_order(round: &Round<'_>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..round.jobs.len()).collect();
    order.sort_by(|a, b| {
        let (x, y) = (&round.jobs[*a], &round.jobs[*b]);
        x.arrival_s.total_cmp(&y.arrival_s).then(x.id.cmp(&y.id))
    });
    order
}
