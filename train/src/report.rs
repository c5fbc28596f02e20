//! `gwtrain report`: reads the logs of finished runs (rank 0's
//! `steps.jsonl` and `params.bin` under each `--out` directory) and prints
//! what the heterogeneous demo reports: mean step time after warm-up, the
//! planner's prediction beside the measurement, the local batches chosen,
//! how far apart the runs' final parameters are, and the step-time ratio of
//! the last run to the first. Kept in the worker's crate so the demo script
//! needs nothing beyond the binaries it builds.

use crate::worker::{StepLog, read_params};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One run's figures after warm-up.
#[derive(Clone, Debug)]
pub struct RunSummary {
    pub name: String,
    pub steps: usize,
    pub warmup: usize,
    pub mean_step_s: f64,
    /// Mean over the post-warm-up steps that had a prediction.
    pub mean_predicted_s: Option<f64>,
    /// Post-warm-up steps with a prediction.
    pub predicted_steps: usize,
    pub mean_loss_first: f64,
    pub mean_loss_last: f64,
    /// Local batches (rank order) chosen after warm-up, with how many steps used each.
    pub batches: Vec<(Vec<u64>, usize)>,
    pub global_batches: Vec<u64>,
    pub logs: Vec<StepLog>,
}

pub fn read_log(dir: &Path) -> Result<Vec<StepLog>, String> {
    let path = dir.join("steps.jsonl");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<StepLog>(l)
                .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

pub fn summarize(name: &str, logs: Vec<StepLog>, warmup: usize) -> Result<RunSummary, String> {
    if logs.len() <= warmup {
        return Err(format!(
            "{name}: {} steps logged, not more than the {warmup} warm-up steps",
            logs.len()
        ));
    }
    let after = &logs[warmup..];
    let mean = |xs: &mut dyn Iterator<Item = f64>| {
        let (s, c) = xs.fold((0.0, 0usize), |(s, c), x| (s + x, c + 1));
        if c == 0 { None } else { Some(s / c as f64) }
    };
    let mean_step_s = mean(&mut after.iter().map(|l| l.step_s)).unwrap_or(0.0);
    let preds: Vec<f64> = after.iter().filter_map(|l| l.predicted_step_s).collect();
    let k = (logs.len() / 10).max(1);
    let mean_loss_first = mean(&mut logs.iter().take(k).map(|l| l.loss)).unwrap_or(0.0);
    let mean_loss_last = mean(&mut logs.iter().rev().take(k).map(|l| l.loss)).unwrap_or(0.0);
    let mut batches: Vec<(Vec<u64>, usize)> = Vec::new();
    for l in after {
        match batches.iter_mut().find(|(b, _)| *b == l.local_batches) {
            Some(e) => e.1 += 1,
            None => batches.push((l.local_batches.clone(), 1)),
        }
    }
    batches.sort_by_key(|b| std::cmp::Reverse(b.1));
    Ok(RunSummary {
        name: name.to_string(),
        steps: logs.len(),
        warmup,
        mean_step_s,
        mean_predicted_s: mean(&mut preds.iter().copied()),
        predicted_steps: preds.len(),
        mean_loss_first,
        mean_loss_last,
        batches,
        global_batches: logs.iter().map(|l| l.global_batch).collect(),
        logs,
    })
}

/// Largest element-wise relative difference, |a−b| / max(|a|, |b|), with
/// elements that are both below 1e-12 in size counted as equal.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> Result<f64, String> {
    if a.len() != b.len() {
        return Err(format!(
            "the parameter files hold {} and {} values",
            a.len(),
            b.len()
        ));
    }
    Ok(a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            let s = x.abs().max(y.abs());
            if s < 1e-12 { 0.0 } else { d / s }
        })
        .fold(0.0, f64::max))
}

fn fmt_batches(b: &[(Vec<u64>, usize)]) -> String {
    let shown: Vec<String> = b
        .iter()
        .take(6)
        .map(|(v, c)| format!("{v:?} ×{c}"))
        .collect();
    let more = if b.len() > 6 {
        format!(", … ({} distinct splits)", b.len())
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(", "))
}

/// The demo's acceptance thresholds, checked by `report --check`.
#[derive(Clone, Copy, Debug)]
pub struct Criteria {
    /// How far the last run's mean step time may exceed the optimum for the
    /// speeds measured in the first run, as a fraction of that optimum.
    pub max_over_optimum: f64,
    /// |measured / predicted − 1| of the last run after warm-up, at most.
    pub max_prediction_error: f64,
    /// Largest relative difference between the runs' final parameters.
    pub max_param_diff: f64,
}

/// What the heterogeneity demo checks: OptPerf within 10% of the best step
/// the even run's measured speeds allow, measured within 15% of the
/// prediction, parameters equal to 1e-5 relative.
pub const DEMO_CRITERIA: Criteria = Criteria {
    max_over_optimum: 0.10,
    max_prediction_error: 0.15,
    max_param_diff: 1e-5,
};

/// Each rank's compute throughput in samples per second over `logs`:
/// Σ b_i / Σ t_i, so that a long step counts by its length rather than as
/// one vote. `None` when a step lacks a rank's compute time or a rank never
/// computed, as then there is no speed to plan with.
pub fn rank_rates(logs: &[StepLog]) -> Option<Vec<f64>> {
    let ranks = logs.first()?.local_batches.len();
    if ranks == 0 {
        return None;
    }
    let mut samples = vec![0.0f64; ranks];
    let mut secs = vec![0.0f64; ranks];
    for l in logs {
        if l.local_batches.len() != ranks || l.compute_s.len() != ranks {
            return None;
        }
        for r in 0..ranks {
            samples[r] += l.local_batches[r] as f64;
            secs[r] += l.compute_s[r];
        }
    }
    let rates: Vec<f64> = samples.iter().zip(&secs).map(|(b, t)| b / t).collect();
    rates
        .iter()
        .all(|r| r.is_finite() && *r > 0.0)
        .then_some(rates)
}

/// The shortest compute time any split of `global_batch` samples can reach
/// on ranks with these throughputs: each rank's share in proportion to its
/// rate makes them all finish together, at B / Σ rate_i. `None` without a
/// positive rate.
pub fn optimum_compute_s(global_batch: f64, rates: &[f64]) -> Option<f64> {
    let total: f64 = rates.iter().sum();
    (total.is_finite() && total > 0.0).then(|| global_batch / total)
}

/// Mean over `logs` of what each step took beyond its slowest compute: that
/// rank arrives last at the all-reduce, so its share of the step is its wait
/// for the plan, the all-reduce itself (no one left to wait for) and the
/// update. No split removes these; a rank's own `comm_s` would not do, as
/// it includes the wait for slower ranks.
pub fn rest_of_step_s(logs: &[StepLog]) -> f64 {
    if logs.is_empty() {
        return 0.0;
    }
    let sum: f64 = logs
        .iter()
        .map(|l| {
            let slowest = l.compute_s.iter().copied().fold(0.0, f64::max);
            (l.step_s - slowest).max(0.0)
        })
        .sum();
    sum / logs.len() as f64
}

/// The best mean step time the speeds measured in `reference` allow for the
/// global batches of `target`.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimum {
    /// B / Σ rate_i, averaged over the target's steps.
    pub compute_s: f64,
    /// See [`rest_of_step_s`], measured in the reference.
    pub rest_s: f64,
    pub rates: Vec<f64>,
}

impl Optimum {
    pub fn step_s(&self) -> f64 {
        self.compute_s + self.rest_s
    }

    /// (slowest rank, fastest rank, how many times longer a sample took on
    /// the slowest).
    pub fn slowdown(&self) -> Option<(usize, usize, f64)> {
        let by_rate = |pick: fn(f64, f64) -> bool| {
            self.rates
                .iter()
                .enumerate()
                .reduce(|a, b| if pick(*b.1, *a.1) { b } else { a })
        };
        let (slow, rs) = by_rate(|b, a| b < a)?;
        let (fast, rf) = by_rate(|b, a| b > a)?;
        Some((slow, fast, rf / rs))
    }
}

pub fn optimum(reference: &RunSummary, target: &RunSummary) -> Option<Optimum> {
    let after = &reference.logs[reference.warmup..];
    let rates = rank_rates(after)?;
    let steps = &target.logs[target.warmup..];
    let mut compute_s = 0.0;
    for l in steps {
        compute_s += optimum_compute_s(l.global_batch as f64, &rates)?;
    }
    Some(Optimum {
        compute_s: compute_s / steps.len().max(1) as f64,
        rest_s: rest_of_step_s(after),
        rates,
    })
}

/// Whether a mean step of `measured_s` is within `max_over` (a fraction) of
/// `optimum_s`. Only the excess counts: a run faster than the optimum means
/// the reference run measured its speeds on a busier machine, which is no
/// fault of the planner.
pub fn near_optimum(measured_s: f64, optimum_s: f64, max_over: f64) -> bool {
    measured_s.is_finite() && optimum_s > 0.0 && measured_s <= optimum_s * (1.0 + max_over)
}

/// The report's text and, when criteria were given, the ones not met.
#[derive(Clone, Debug)]
pub struct Report {
    pub text: String,
    pub failed: Vec<String>,
}

/// The text of the report for runs `(name, dir)`; the last line compares the
/// last run's mean step time to the first's, and the first run's measured
/// speeds give the optimum the last run is judged against.
/// `requested_slowdown` (what the runs were started with) is printed beside
/// the slowdown measured.
pub fn report(
    runs: &[(String, PathBuf)],
    warmup: usize,
    requested_slowdown: Option<u32>,
    check: Option<Criteria>,
) -> Result<Report, String> {
    if runs.is_empty() {
        return Err("no runs to report on".into());
    }
    let mut o = String::new();
    let mut sums = Vec::new();
    for (name, dir) in runs {
        let s = summarize(name, read_log(dir)?, warmup)?;
        let _ = writeln!(
            o,
            "== {name}: {} steps (first {warmup} are warm-up), loss {:.4} -> {:.4}",
            s.steps, s.mean_loss_first, s.mean_loss_last
        );
        let _ = writeln!(o, "  step  local batches          predicted   measured");
        let stride = (s.steps / 12).max(1);
        let mut shown: Vec<usize> = (0..s.steps).step_by(stride).collect();
        if shown.last() != Some(&(s.steps - 1)) {
            shown.push(s.steps - 1);
        }
        for l in shown.iter().map(|&i| &s.logs[i]) {
            let pred = l
                .predicted_step_s
                .map(|p| format!("{:>8.1} ms", p * 1e3))
                .unwrap_or_else(|| format!("{:>11}", "-"));
            let _ = writeln!(
                o,
                "  {:>4}  {:<22} {pred} {:>8.1} ms",
                l.step,
                format!("{:?}", l.local_batches),
                l.step_s * 1e3
            );
        }
        let _ = writeln!(
            o,
            "  mean step time after warm-up: {:.1} ms",
            s.mean_step_s * 1e3
        );
        match s.mean_predicted_s {
            Some(p) => {
                let _ = writeln!(
                    o,
                    "  predicted step time after warm-up: {:.1} ms (measured/predicted {:.3}, {} steps with a prediction)",
                    p * 1e3,
                    s.mean_step_s / p,
                    s.predicted_steps
                );
            }
            None => {
                let _ = writeln!(o, "  predicted step time: none given by the planner");
            }
        }
        let _ = writeln!(
            o,
            "  local batches chosen after warm-up: {}",
            fmt_batches(&s.batches)
        );
        let per_rank = |f: fn(&StepLog) -> &Vec<f64>| -> String {
            let after = &s.logs[s.warmup..];
            let ranks = after.iter().map(|l| f(l).len()).max().unwrap_or(0);
            let means: Vec<String> = (0..ranks)
                .map(|r| {
                    let v: Vec<f64> = after.iter().filter_map(|l| f(l).get(r).copied()).collect();
                    format!("{:.1}", v.iter().sum::<f64>() / v.len().max(1) as f64 * 1e3)
                })
                .collect();
            format!("[{}]", means.join(", "))
        };
        let _ = writeln!(
            o,
            "  per rank after warm-up (ms): compute {}, all-reduce {}, waiting for the plan {}",
            per_rank(|l| &l.compute_s),
            per_rank(|l| &l.comm_s),
            per_rank(|l| &l.plan_s)
        );
        sums.push(s);
    }
    let first = &sums[0];
    let last = &sums[sums.len() - 1];
    let mut failed = Vec::new();
    let mut verdict = |o: &mut String, what: String, ok: bool| {
        if check.is_some() {
            let _ = writeln!(o, "check: {what}: {}", if ok { "yes" } else { "NO" });
            if !ok {
                failed.push(what);
            }
        }
    };
    if sums.len() > 1 {
        let same_b = sums
            .iter()
            .all(|s| s.global_batches == first.global_batches);
        let _ = writeln!(
            o,
            "global batches identical in every run: {}",
            if same_b { "yes" } else { "NO" }
        );
        let p0 = read_params(&runs[0].1.join("params.bin"))?;
        let mut worst = 0.0f64;
        for (name, dir) in runs.iter().skip(1) {
            let pi = read_params(&dir.join("params.bin"))?;
            let d = max_rel_diff(&p0, &pi)?;
            worst = worst.max(d);
            let _ = writeln!(
                o,
                "max relative difference of final parameters, {} vs {name}: {d:.3e}",
                runs[0].0,
            );
        }
        if let Some(c) = check {
            verdict(
                &mut o,
                "same global batch every step in every run".into(),
                same_b,
            );
            verdict(
                &mut o,
                format!(
                    "final parameters agree within {:e} relative ({worst:.1e})",
                    c.max_param_diff
                ),
                worst <= c.max_param_diff,
            );
        }
    }
    // A single run has no speeds measured elsewhere to be judged against.
    let best = if sums.len() > 1 {
        optimum(first, last)
    } else {
        None
    };
    if sums.len() > 1 {
        match &best {
            Some(b) => {
                if let Some((slow, fast, k)) = b.slowdown().filter(|x| x.0 != x.1) {
                    let asked = requested_slowdown
                        .map(|r| format!(" (requested {r}×)"))
                        .unwrap_or_default();
                    let _ = writeln!(
                        o,
                        "rank {slow} computed {k:.2}× slower than rank {fast} in {}{asked}",
                        first.name
                    );
                }
                let _ = writeln!(
                    o,
                    "optimum step for the speeds measured in {}: {:.1} ms = {:.1} ms of compute (B / Σ b_i/t_i) + {:.1} ms of plan, all-reduce and update no split removes",
                    first.name,
                    b.step_s() * 1e3,
                    b.compute_s * 1e3,
                    b.rest_s * 1e3
                );
                let _ = writeln!(
                    o,
                    "{} mean step time {:.1} ms: {:.3}× that optimum",
                    last.name,
                    last.mean_step_s * 1e3,
                    last.mean_step_s / b.step_s()
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "optimum step: none, {} lacks per-rank compute times",
                    first.name
                );
            }
        }
    }
    let ratio = if first.mean_step_s > 0.0 {
        last.mean_step_s / first.mean_step_s
    } else {
        f64::NAN
    };
    if let Some(c) = check {
        let (ok, got) = match last.mean_predicted_s {
            Some(p) if p > 0.0 => {
                let e = last.mean_step_s / p - 1.0;
                (
                    e.abs() <= c.max_prediction_error,
                    format!("{:+.1}%", e * 100.0),
                )
            }
            _ => (false, "no prediction".into()),
        };
        verdict(
            &mut o,
            format!(
                "{} measured step time within {:.0}% of the predicted ({got})",
                last.name,
                c.max_prediction_error * 100.0
            ),
            ok,
        );
        if sums.len() > 1 {
            let (ok, got) = match &best {
                Some(b) => (
                    near_optimum(last.mean_step_s, b.step_s(), c.max_over_optimum),
                    format!("{:.3}×", last.mean_step_s / b.step_s()),
                ),
                None => (false, "no optimum".into()),
            };
            verdict(
                &mut o,
                format!(
                    "{} mean step time within {:.0}% of the optimum for {}'s speeds ({got})",
                    last.name,
                    c.max_over_optimum * 100.0,
                    first.name
                ),
                ok,
            );
        }
    }
    let _ = write!(
        o,
        "{}/{} step time ratio: {ratio:.2}",
        last.name, first.name
    );
    Ok(Report { text: o, failed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(step: u64, b: Vec<u64>, step_s: f64, pred: Option<f64>) -> StepLog {
        StepLog {
            step,
            global_batch: b.iter().sum(),
            weights: vec![0.5; b.len()],
            local_batches: b,
            step_s,
            compute_s: vec![],
            comm_s: vec![],
            plan_s: vec![],
            predicted_step_s: pred,
            algo: "auto".into(),
            loss: 1.0 / (step + 1) as f64,
            grad_sq: 0.0,
        }
    }

    #[test]
    fn summary_skips_warmup_and_counts_splits() {
        let logs = vec![
            log(0, vec![4, 4], 9.0, None),
            log(1, vec![6, 2], 1.0, Some(1.0)),
            log(2, vec![6, 2], 3.0, Some(2.0)),
            log(3, vec![5, 3], 2.0, None),
        ];
        let s = summarize("x", logs, 1).expect("summary");
        assert_eq!(s.mean_step_s, 2.0);
        assert_eq!(s.mean_predicted_s, Some(1.5));
        assert_eq!(s.predicted_steps, 2);
        assert_eq!(s.batches[0], (vec![6, 2], 2));
        assert!(summarize("x", vec![log(0, vec![1], 1.0, None)], 1).is_err());
    }

    /// A step of the issue's even run: rank 1 asked to be 3× slower but
    /// computing 1024 samples in 47.4 ms against rank 0's 24.3 ms.
    fn timed(step: u64, b: Vec<u64>, compute_s: Vec<f64>, step_s: f64) -> StepLog {
        let mut l = log(step, b, step_s, Some(step_s));
        l.comm_s = vec![0.0; compute_s.len()];
        l.compute_s = compute_s;
        l
    }

    #[test]
    fn optimum_of_the_issues_even_run() {
        let even = vec![timed(0, vec![1024, 1024], vec![0.0243, 0.0474], 0.0486); 3];
        let rates = rank_rates(&even).expect("rates");
        assert!((rates[0] - 1024.0 / 0.0243).abs() < 1e-6);
        // By hand: 2048 / (1024/24.3 + 1024/47.4) = 2·24.3·47.4 / 71.7 ms.
        let c = optimum_compute_s(2048.0, &rates).expect("optimum");
        assert!((c * 1e3 - 2.0 * 24.3 * 47.4 / 71.7).abs() < 1e-9, "{c}");
        assert!((c * 1e3 - 32.129).abs() < 1e-3, "{c}");
        // The slowest rank's 47.4 ms of the 48.6 ms step leave 1.2 ms.
        assert!((rest_of_step_s(&even) - 0.0012).abs() < 1e-12);
        let s = summarize("even", even, 1).expect("summary");
        let best = optimum(&s, &s).expect("optimum");
        assert!((best.step_s() - (c + 0.0012)).abs() < 1e-12);
        let (slow, fast, k) = best.slowdown().expect("two ranks");
        assert_eq!((slow, fast), (1, 0));
        assert!((k - 47.4 / 24.3).abs() < 1e-12, "{k}");
    }

    #[test]
    fn rates_need_every_ranks_compute_time() {
        assert_eq!(rank_rates(&[]), None);
        assert_eq!(rank_rates(&[log(0, vec![4, 4], 1.0, None)]), None);
        assert_eq!(
            rank_rates(&[timed(0, vec![4, 4], vec![0.1, 0.0], 1.0)]),
            None
        );
        // A rank's speed weighs its steps by their length.
        let r = rank_rates(&[
            timed(0, vec![10], vec![1.0], 1.0),
            timed(1, vec![30], vec![1.0], 1.0),
        ])
        .expect("rates");
        assert_eq!(r, [20.0]);
        assert_eq!(optimum_compute_s(8.0, &[]), None);
        assert_eq!(optimum_compute_s(8.0, &[2.0, 2.0]), Some(2.0));
    }

    #[test]
    fn near_optimum_decides_on_the_excess_only() {
        assert!(near_optimum(0.0328, 0.0321, 0.10));
        assert!(near_optimum(0.110, 0.100, 0.10 + 1e-12));
        assert!(!near_optimum(0.0354, 0.0321, 0.10));
        assert!(near_optimum(0.020, 0.0321, 0.10));
        assert!(!near_optimum(f64::NAN, 0.0321, 0.10));
        assert!(!near_optimum(0.03, 0.0, 0.10));
    }

    /// Writes a run's rank-0 outputs (steps.jsonl, params.bin) under `dir`.
    fn write_run(dir: &Path, logs: &[StepLog], params: &[f64]) {
        std::fs::create_dir_all(dir).expect("run dir");
        let text: String = logs
            .iter()
            .map(|l| serde_json::to_string(l).expect("json") + "\n")
            .collect();
        std::fs::write(dir.join("steps.jsonl"), text).expect("steps.jsonl");
        crate::worker::write_params(&dir.join("params.bin"), params).expect("params");
    }

    #[test]
    fn check_judges_optperf_against_the_measured_optimum() {
        let root = std::env::temp_dir().join(format!("gwtrain-report-{}", std::process::id()));
        let even: Vec<StepLog> = (0..4)
            .map(|s| timed(s, vec![1024, 1024], vec![0.0243, 0.0474], 0.0486))
            .collect();
        // The issue's OptPerf run: 32.8 ms, under the optimum of 33.3 ms and
        // 0.675× the even step, which the fixed 0.6 ratio failed.
        let fast: Vec<StepLog> = (0..4)
            .map(|s| timed(s, vec![1360, 688], vec![0.0322, 0.0318], 0.0328))
            .collect();
        // 37 ms: 1.11× the optimum.
        let slow: Vec<StepLog> = (0..4)
            .map(|s| timed(s, vec![1200, 848], vec![0.0285, 0.0392], 0.0370))
            .collect();
        write_run(&root.join("even"), &even, &[1.0, 2.0]);
        write_run(&root.join("fast"), &fast, &[1.0, 2.0]);
        write_run(&root.join("slow"), &slow, &[1.0, 2.0]);
        let runs = |last: &str| {
            vec![
                ("even".to_string(), root.join("even")),
                ("optperf".to_string(), root.join(last)),
            ]
        };
        let good = report(&runs("fast"), 1, Some(3), Some(DEMO_CRITERIA));
        let bad = report(&runs("slow"), 1, None, Some(DEMO_CRITERIA));
        let _ = std::fs::remove_dir_all(&root);
        let good = good.expect("report");
        assert!(good.failed.is_empty(), "{}", good.text);
        for want in [
            "rank 1 computed 1.95× slower than rank 0 in even (requested 3×)",
            "optimum step for the speeds measured in even: 33.3 ms = 32.1 ms of compute",
            "optperf mean step time 32.8 ms: 0.984× that optimum",
            "check: optperf mean step time within 10% of the optimum for even's speeds (0.984×): yes",
        ] {
            assert!(good.text.contains(want), "lacks {want:?}:\n{}", good.text);
        }
        assert!(
            good.text.ends_with("\noptperf/even step time ratio: 0.67"),
            "{}",
            good.text
        );
        let bad = bad.expect("report");
        assert_eq!(
            bad.failed,
            ["optperf mean step time within 10% of the optimum for even's speeds (1.110×)"]
        );
        assert!(
            bad.text
                .contains("rank 1 computed 1.95× slower than rank 0 in even\n")
        );
    }

    #[test]
    fn relative_difference() {
        assert_eq!(max_rel_diff(&[1.0, 0.0], &[1.0, 1e-13]), Ok(0.0));
        let d = max_rel_diff(&[2.0, 1.0], &[2.0, 1.5]).expect("same length");
        assert!((d - 1.0 / 3.0).abs() < 1e-12);
        assert!(max_rel_diff(&[1.0], &[]).is_err());
    }
}
