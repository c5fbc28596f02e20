//! What a simulation measured, as the table `gwjob simulate` prints and the
//! JSON object it prints with `--json`.
//!
//! Finish-time fairness (Themis, NSDI 2020; Gavel): ρ_j = JCT_j divided by
//! the JCT job j would have had alone on a 1/N_j share of the cluster, N_j
//! being the average number of jobs present during its life (see
//! [`crate::lp::fair_share`]). ρ ≤ 1: the job did no worse than its share.

use serde::Serialize;

/// The keys of [`Report::json`], in order: what scripts and tests read.
pub const REPORT_KEYS: [&str; 12] = [
    "policy",
    "jobs",
    "avg_jct_s",
    "p99_jct_s",
    "makespan_s",
    "avg_queue_s",
    "utilization",
    "ftf",
    "ftf_max",
    "rounds",
    "round_s",
    "seed",
];

/// The keys among [`REPORT_KEYS`] that measure the schedule (all positive
/// once any job ran).
pub const METRIC_KEYS: [&str; 7] = [
    "avg_jct_s",
    "p99_jct_s",
    "makespan_s",
    "avg_queue_s",
    "utilization",
    "ftf",
    "ftf_max",
];

/// The summary; field names are the JSON keys.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub policy: String,
    pub jobs: usize,
    pub avg_jct_s: f64,
    pub p99_jct_s: f64,
    pub makespan_s: f64,
    pub avg_queue_s: f64,
    /// Busy slot-seconds over all slot-seconds from first arrival to last
    /// finish.
    pub utilization: f64,
    /// Mean ρ over jobs.
    pub ftf: f64,
    /// Worst ρ.
    pub ftf_max: f64,
    pub rounds: u64,
    pub round_s: f64,
    pub seed: u64,
    /// Mean and largest time a policy took for one round's decision (wall
    /// clock; not in the JSON, which must be the same on every run).
    #[serde(skip)]
    pub decide_ms: (f64, f64),
    #[serde(skip)]
    pub per_job: Vec<JobOutcome>,
}

/// One job's life in the simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutcome {
    pub id: String,
    pub arrival_s: f64,
    pub start_s: f64,
    pub finish_s: f64,
    /// steps × batch: what the job must be credited to finish.
    pub samples_needed: u64,
    pub samples_credited: u64,
    /// Samples its copies processed (more than credited when forked).
    pub samples_processed: u64,
    pub ftf: f64,
}

impl Report {
    /// The JSON object, keys in a fixed order, so the same run gives the
    /// same bytes.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// A two-column table for people.
    pub fn table(&self) -> String {
        let h = |s: f64| format!("{:.2} h ({s:.0} s)", s / 3600.0);
        let rows = [
            ("policy", self.policy.clone()),
            ("jobs", self.jobs.to_string()),
            ("average JCT", h(self.avg_jct_s)),
            ("p99 JCT", h(self.p99_jct_s)),
            ("makespan", h(self.makespan_s)),
            ("average queueing", h(self.avg_queue_s)),
            ("utilisation", format!("{:.1} %", 100.0 * self.utilization)),
            (
                "finish-time fairness",
                format!("{:.3} mean, {:.3} worst", self.ftf, self.ftf_max),
            ),
            ("rounds", format!("{} of {} s", self.rounds, self.round_s)),
            (
                "decision time",
                format!(
                    "{:.2} ms mean, {:.2} ms max",
                    self.decide_ms.0, self.decide_ms.1
                ),
            ),
        ];
        rows.iter().map(|(k, v)| format!("{k:<22}{v}\n")).collect()
    }
}

/// The nearest-rank percentile `p` (0–100) of `xs`.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs[..10], 99.0), 10.0);
        assert_eq!(percentile(&[3.0], 50.0), 3.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    #[test]
    fn the_key_lists_are_the_json_keys() {
        let r = Report {
            policy: "fifo".into(),
            jobs: 1,
            avg_jct_s: 1.0,
            p99_jct_s: 1.0,
            makespan_s: 1.0,
            avg_queue_s: 0.0,
            utilization: 0.5,
            ftf: 1.0,
            ftf_max: 1.0,
            rounds: 1,
            round_s: 60.0,
            seed: 0,
            decide_ms: (0.0, 0.0),
            per_job: Vec::new(),
        };
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("JSON");
        let keys: Vec<&str> = v
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = REPORT_KEYS.to_vec();
        let mut got = keys.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
        assert!(METRIC_KEYS.iter().all(|k| REPORT_KEYS.contains(k)));
    }
}
