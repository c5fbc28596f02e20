//! NoiseScale on synthetic gradients with a known G and Σ = σ²I, over
//! unequal local batches.

mod common;

use gw_planner::NoiseScale;
use rand::SeedableRng;
use rand::rngs::StdRng;

const DIM: usize = 64;

struct Truth {
    g: Vec<f64>,
    sigma: f64,
}

impl Truth {
    fn new(rng: &mut StdRng, noise_scale: f64) -> Truth {
        // |G|² = 1, tr(Σ) = DIM·σ² = noise_scale.
        let g: Vec<f64> = (0..DIM).map(|_| common::normal(rng)).collect();
        let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        Truth {
            g: g.iter().map(|x| x / norm).collect(),
            sigma: (noise_scale / DIM as f64).sqrt(),
        }
    }

    /// One step: per-sample gradients G + σz, each rank's mean over its
    /// batch, and the b-weighted mean of those (the all-reduce). Returns the
    /// squared norms the ranks would report.
    fn step(&self, rng: &mut StdRng, batches: &[u64]) -> (Vec<f64>, f64) {
        let total: u64 = batches.iter().sum();
        let mut global = vec![0.0; DIM];
        let mut local_sq = Vec::with_capacity(batches.len());
        for &b in batches {
            let mut sum = vec![0.0; DIM];
            for _ in 0..b {
                for (s, g) in sum.iter_mut().zip(&self.g) {
                    *s += g + self.sigma * common::normal(rng);
                }
            }
            let mean: Vec<f64> = sum.iter().map(|s| s / b as f64).collect();
            local_sq.push(mean.iter().map(|x| x * x).sum());
            for (acc, m) in global.iter_mut().zip(&mean) {
                *acc += b as f64 / total as f64 * m;
            }
        }
        (local_sq, global.iter().map(|x| x * x).sum())
    }
}

/// The formula for equal local batches applied blindly: average the ranks'
/// |g_i|² equally and take B/n as the small batch.
#[derive(Default)]
struct Naive {
    trace: f64,
    grad_sq: f64,
}

impl Naive {
    fn observe(&mut self, batches: &[u64], local_sq: &[f64], global_sq: f64) {
        let n = batches.len() as f64;
        let big = batches.iter().sum::<u64>() as f64;
        let small = big / n;
        let mean = local_sq.iter().sum::<f64>() / n;
        self.trace += (mean - global_sq) / (1.0 / small - 1.0 / big);
        self.grad_sq += (big * global_sq - small * mean) / (big - small);
    }

    fn estimate(&self) -> f64 {
        self.trace / self.grad_sq
    }
}

fn run(
    batches: &[u64],
    truth_scale: f64,
    steps: usize,
    seed: u64,
    decay: f64,
) -> (NoiseScale, Naive) {
    let mut rng = StdRng::seed_from_u64(seed);
    let truth = Truth::new(&mut rng, truth_scale);
    let mut ours = NoiseScale::with_decay(decay);
    let mut naive = Naive::default();
    for _ in 0..steps {
        let (local, global) = truth.step(&mut rng, batches);
        ours.observe(batches, &local, global);
        naive.observe(batches, &local, global);
    }
    (ours, naive)
}

#[test]
fn unequal_batches_estimate_the_true_noise_scale_where_the_naive_formula_is_biased() {
    let truth = 50.0;
    let (ours, naive) = run(&[4, 12, 32, 80], truth, 1500, 1, 0.999);
    let est = ours.estimate().expect("defined");
    assert!(
        (est / truth - 1.0).abs() < 0.1,
        "estimate {est}, truth {truth}"
    );
    let trace = ours.trace_sigma().expect("defined");
    let grad_sq = ours.grad_sq().expect("defined");
    assert!(
        (trace / truth - 1.0).abs() < 0.1 && (grad_sq - 1.0).abs() < 0.1,
        "{trace} {grad_sq}"
    );
    // The naive formula overstates tr(Σ) ~3.7× and understates |G|² (here
    // its expectation is even negative), so its B_noise is meaningless.
    let steps = 1500.0;
    let (naive_trace, naive_grad_sq) = (naive.trace / steps, naive.grad_sq / steps);
    assert!(naive_trace > 3.0 * truth, "naive tr(Σ) {naive_trace}");
    assert!(naive_grad_sq < 0.5, "naive |G|² {naive_grad_sq}");
    assert!(!(naive.estimate() > 0.0 && (naive.estimate() / truth - 1.0).abs() < 0.5));
    assert_eq!(ours.steps(), 1500);
}

#[test]
fn equal_batches_reduce_to_mccandlish() {
    // Plain averages (decay 1) so that both sum the same per-step values.
    let (ours, naive) = run(&[16, 16, 16, 16], 30.0, 300, 2, 1.0);
    let est = ours.estimate().expect("defined");
    assert!(
        (est / naive.estimate() - 1.0).abs() < 1e-9,
        "{est} vs {}",
        naive.estimate()
    );
    assert!((est / 30.0 - 1.0).abs() < 0.25, "{est}");
}

#[test]
fn undefined_until_usable_steps_arrive() {
    let mut ns = NoiseScale::default();
    assert_eq!(ns.estimate(), None);
    // One rank, mismatched lengths, NaN, negative: nothing learned.
    ns.observe(&[32], &[1.0], 0.5);
    ns.observe(&[32, 32], &[1.0], 0.5);
    ns.observe(&[32, 32], &[f64::NAN, 1.0], 0.5);
    ns.observe(&[32, 32], &[1.0, 1.0], -0.5);
    // A rank with no samples has no gradient: this is a one-rank step.
    ns.observe(&[32, 0], &[1.0, 9.0], 1.0);
    assert_eq!(ns.steps(), 0);
    assert_eq!(ns.estimate(), None);
    // |G|² estimate ≤ 0 (here: the all-reduced gradient much smaller than
    // the local ones) leaves it undefined.
    ns.observe(&[8, 8], &[1.0, 1.0], 0.01);
    assert_eq!(ns.steps(), 1);
    assert!(ns.grad_sq().is_some_and(|g| g < 0.0));
    assert_eq!(ns.estimate(), None);
}

#[test]
fn serde_round_trip_keeps_the_estimate() {
    let (ours, _) = run(&[8, 24], 20.0, 50, 3, 0.99);
    let json = serde_json::to_string(&ours).expect("serializes");
    let back: NoiseScale = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back.estimate(), ours.estimate());
    assert_eq!(back.steps(), ours.steps());
}

/// Huge but finite norms are dropped whole: the estimator never holds a
/// non-finite sum (which would be stored as JSON `null`).
#[test]
fn extreme_finite_norms_never_leave_a_non_finite_estimator() {
    let mut n = NoiseScale::default();
    n.observe(&[8, 8], &[1.0, 1.2], 1.0);
    let good = n.estimate();
    n.observe(&[8, 8], &[f64::MAX, 1e308], 1e308);
    n.observe(&[u64::MAX, u64::MAX], &[1e300, 1e300], 0.0);
    let json = serde_json::to_string(&n).expect("serializes");
    assert!(!json.contains("null"), "{json}");
    let back: NoiseScale = serde_json::from_str(&json).expect("decodes");
    assert_eq!(back.estimate(), n.estimate());
    // The normal step before them still stands.
    assert_eq!(n.estimate(), good);
}
