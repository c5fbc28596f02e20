//! How long plan_optperf takes as the job grows: the job server re-plans
//! online, between steps, so planning must stay far below a step's time
//! even at 100,000 ranks. Prints the median of several rounds per size.
//!
//! Run with `cargo bench -p gw-planner`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gw_planner::{Linear, plan_optperf};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Mean local batch per rank; bounds [LO, HI].
const MEAN_BATCH: u64 = 64;
const LO: u64 = 1;
const HI: u64 = 1024;
const ROUNDS: usize = 21;

fn models(ranks: usize, rng: &mut StdRng) -> Vec<Linear> {
    (0..ranks)
        .map(|_| Linear {
            // Up to 8× speed differences, a few ms of fixed overhead.
            a: rng.random_range(0.5e-3..4e-3),
            c: rng.random_range(0.0..5e-3),
        })
        .collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    println!(
        "plan_optperf, random heterogeneous models, global = {MEAN_BATCH} × ranks, bounds [{LO}, {HI}], median of {ROUNDS}"
    );
    println!(
        "{:>9} | {:>12} | {:>12} | {:>12}",
        "ranks", "median", "per rank", "fastest"
    );
    println!("{:->9}-+-{:->12}-+-{:->12}-+-{:->12}", "", "", "", "");
    for ranks in [10usize, 1_000, 100_000] {
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let m = models(ranks, &mut rng);
            let global = MEAN_BATCH * ranks as u64;
            let start = Instant::now();
            let plan = plan_optperf(black_box(&m), global, LO, HI);
            times.push(start.elapsed());
            if let Err(e) = black_box(plan) {
                eprintln!("planning failed: {e}");
                std::process::exit(1);
            }
        }
        let fastest = times.iter().min().copied().unwrap_or_default();
        let med = median(times);
        println!(
            "{:>9} | {:>9.3} ms | {:>9.1} ns | {:>9.3} ms",
            ranks,
            med.as_secs_f64() * 1e3,
            med.as_secs_f64() * 1e9 / ranks as f64,
            fastest.as_secs_f64() * 1e3
        );
    }
}
