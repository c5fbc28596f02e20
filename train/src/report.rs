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

/// The text of the report for runs `(name, dir)`; the last line compares the
/// last run's mean step time to the first's.
/// The demo's acceptance thresholds, checked by `report --check`.
#[derive(Clone, Copy, Debug)]
pub struct Criteria {
    /// Last run's mean step time over the first's, at most.
    pub max_ratio: f64,
    /// |measured / predicted − 1| of the last run after warm-up, at most.
    pub max_prediction_error: f64,
    /// Largest relative difference between the runs' final parameters.
    pub max_param_diff: f64,
}

/// What the heterogeneity demo checks: OptPerf ≤ 0.6× the even split, measured within
/// 15% of the prediction, parameters equal to 1e-5 relative.
pub const DEMO_CRITERIA: Criteria = Criteria {
    max_ratio: 0.6,
    max_prediction_error: 0.15,
    max_param_diff: 1e-5,
};

/// The report's text and, when criteria were given, the ones not met.
#[derive(Clone, Debug)]
pub struct Report {
    pub text: String,
    pub failed: Vec<String>,
}

pub fn report(
    runs: &[(String, PathBuf)],
    warmup: usize,
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
            verdict(
                &mut o,
                format!(
                    "{}/{} step time ratio at most {:.2} ({ratio:.3})",
                    last.name, first.name, c.max_ratio
                ),
                ratio <= c.max_ratio,
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

    #[test]
    fn relative_difference() {
        assert_eq!(max_rel_diff(&[1.0, 0.0], &[1.0, 1e-13]), Ok(0.0));
        let d = max_rel_diff(&[2.0, 1.0], &[2.0, 1.5]).expect("same length");
        assert!((d - 1.0 / 3.0).abs() < 1e-12);
        assert!(max_rel_diff(&[1.0], &[]).is_err());
    }
}
