//! Synthetic traces in the style of Gavel's simulations, on the throughputs
//! Gavel's authors measured on K80, P100 and V100 GPUs
//! (`data/gavel-throughputs.csv`, from /work/shared/data; see its README).
//!
//! * arrivals: a Poisson process of `rate` jobs per hour (first job at 0);
//! * model: uniform over the table's job types;
//! * workers: 1, 2, 4 or 8 with probabilities 0.70, 0.10, 0.15, 0.05 (1
//!   where the table has no row for that count);
//! * duration on V100s: 60 · 10^u s, u uniform on [1.5, 3] with probability
//!   0.8 and on [3, 4] otherwise; steps = duration × V100 throughput;
//! * throughputs: the table's row for the model and worker count;
//! * global batch: the model's batch size per worker (32 if it has none).

use crate::rng::Rng;
use crate::trace::{Trace, TraceJob};

const TABLE: &str = include_str!("../data/gavel-throughputs.csv");
/// The table's columns after `job_type, workers`.
const TYPES: [&str; 3] = ["k80", "p100", "v100"];

/// One row of the table.
struct Row {
    model: String,
    workers: u32,
    tput: [f64; 3],
}

fn table() -> Vec<Row> {
    let mut rows = Vec::new();
    for line in TABLE.lines().skip(1) {
        // The name is quoted and may hold commas; the numbers follow it.
        let Some((name, rest)) = line.rsplit_once('"') else {
            continue;
        };
        let name = name.trim_start_matches('"');
        let nums: Vec<f64> = rest
            .split(',')
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse().ok())
            .collect();
        if let [w, k80, p100, v100] = nums[..] {
            rows.push(Row {
                model: name.to_owned(),
                workers: w as u32,
                tput: [k80, p100, v100],
            });
        }
    }
    rows
}

/// `ResNet-18 (batch size 128)` → (`resnet-18-bs128`, Some(128)).
fn label(model: &str) -> (String, Option<u64>) {
    let (base, batch) = match model.split_once(" (batch size ") {
        Some((b, rest)) => (b, rest.trim_end_matches(')').parse().ok()),
        None => (model, None),
    };
    let mut slug: String = base
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if let Some(b) = batch {
        slug += &format!("-bs{b}");
    }
    (slug, batch)
}

/// A trace of `jobs` jobs drawn with `seed` at `rate` jobs per hour.
pub fn generate(jobs: usize, seed: u64, rate: f64) -> Trace {
    let rows = table();
    let mut models: Vec<&str> = Vec::new();
    for r in &rows {
        if !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    let mut rng = Rng::new(seed);
    let mut now = 0.0f64;
    let mut out = Vec::with_capacity(jobs);
    for i in 0..jobs {
        if i > 0 {
            now += -(1.0 - rng.unit()).ln() * 3600.0 / rate;
        }
        let model = models[(rng.unit() * models.len() as f64) as usize % models.len()];
        let p = rng.unit();
        let want = if p < 0.70 {
            1
        } else if p < 0.80 {
            2
        } else if p < 0.95 {
            4
        } else {
            8
        };
        let row = rows
            .iter()
            .find(|r| r.model == model && r.workers == want)
            .or_else(|| rows.iter().find(|r| r.model == model && r.workers == 1));
        let Some(row) = row else { continue };
        let u = if rng.unit() < 0.8 {
            1.5 + 1.5 * rng.unit()
        } else {
            3.0 + rng.unit()
        };
        let duration = 60.0 * 10f64.powf(u);
        let steps = (duration * row.tput[2]).ceil().max(1.0) as u64;
        let (slug, per_worker) = label(model);
        let workers = u64::from(row.workers);
        out.push(TraceJob {
            id: format!("j{}", i + 1),
            model: Some(slug),
            // Millisecond precision keeps the files short and exact.
            arrival_s: (now * 1000.0).round() / 1000.0,
            workers: row.workers,
            steps,
            batch: per_worker.unwrap_or(32) * workers,
            tput: TYPES
                .iter()
                .zip(row.tput)
                .rev()
                .map(|(k, t)| ((*k).to_owned(), t))
                .collect(),
        });
    }
    Trace { jobs: out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_read_whole_and_traces_follow_the_mix() {
        let rows = table();
        assert_eq!(rows.len(), 83);
        assert_eq!(
            label("ResNet-18 (batch size 128)"),
            ("resnet-18-bs128".into(), Some(128))
        );
        assert_eq!(label("A3C"), ("a3c".into(), None));
        let t = generate(2000, 7, 10.0);
        assert_eq!(t.jobs.len(), 2000);
        let single = t.jobs.iter().filter(|j| j.workers == 1).count() as f64 / 2000.0;
        assert!((0.70..0.90).contains(&single), "{single}");
        let span = t.jobs.last().map_or(0.0, |j| j.arrival_s);
        // 2000 arrivals at 10/h take about 200 h.
        assert!((150.0 * 3600.0..250.0 * 3600.0).contains(&span), "{span}");
        assert_eq!(
            Trace::parse("g", &t.render()).expect("generated traces parse"),
            t
        );
        assert_eq!(generate(50, 7, 10.0), generate(50, 7, 10.0));
        assert_ne!(generate(50, 7, 10.0), generate(50, 8, 10.0));
    }
}
