//! `gwbench calibrate`: measures the cost model's parameters on this machine.
//!
//! The model (`gw_collectives::model`) prices a 2-rank ring all-reduce of S
//! bytes at `2α + S·β + S/2·γ`, so timing that all-reduce at 8 B and at
//! 8 MiB over each transport gives α and β directly, in the same terms the
//! algorithm choice uses; γ comes from timing the reduction kernel alone.
//! Rank 0 writes the result to the file every later job's rank 0 reads.

use gw_collectives::model::{CostModel, Link};
use gw_collectives::reduce::Kernel;
use gw_collectives::{
    Algo, CommKey, Communicator, Config, DType, LaunchEnv, OpKind, RawOp, RedOp, TransportChoice,
};
use std::time::Instant;

const BIG: usize = 8 << 20;

/// Median seconds of `iters` calls of a 2-rank ring all-reduce of `bytes`.
fn time_all_reduce(comm: &Communicator, bytes: usize, iters: usize) -> Result<f64, String> {
    let n = bytes / 4;
    let send = vec![1.0f32; n];
    let mut recv = vec![0.0f32; n];
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + 3 {
        comm.barrier().map_err(|e| format!("barrier: {e}"))?;
        let t0 = Instant::now();
        let op = RawOp {
            kind: OpKind::AllReduce,
            dtype: DType::F32,
            redop: RedOp::Sum,
            count: n,
            root: 0,
            send: send.as_ptr().cast(),
            recv: recv.as_mut_ptr().cast(),
            weight: None,
        };
        // SAFETY: both buffers outlive the wait below.
        unsafe { comm.run_raw(op, Some(Algo::Ring)) }
            .map_err(|e| format!("all-reduce of {bytes} B: {e}"))?;
        if i >= 3 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    // The slower rank's time is the collective's.
    let mut worst = vec![0.0f64; times.len()];
    comm.all_reduce(&times, &mut worst, RedOp::Max)
        .map_err(|e| format!("all-reduce of the timings: {e}"))?;
    worst.sort_by(f64::total_cmp);
    Ok(worst[worst.len() / 2])
}

/// γ: seconds per byte of a three-operand f32 sum, median of several runs.
fn measure_gamma() -> Result<f64, String> {
    let n = BIG / 4;
    let a = vec![1.0f32; n];
    let b = vec![2.0f32; n];
    let mut d = vec![0.0f32; n];
    let k = Kernel::new(DType::F32, RedOp::Sum, 2).map_err(|e| e.to_string())?;
    let mut t = Vec::new();
    for _ in 0..9 {
        let t0 = Instant::now();
        // SAFETY: three distinct buffers of n f32 each.
        unsafe {
            k.reduce(
                d.as_mut_ptr().cast(),
                a.as_ptr().cast(),
                None,
                b.as_ptr().cast(),
                None,
                n,
                false,
            )
        };
        t.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&d);
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2] / BIG as f64)
}

fn link(choice: TransportChoice, gamma: f64) -> Result<Link, String> {
    let mut cfg = Config::default();
    cfg.transport.set(choice);
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    let key = CommKey::next(&format!("calibrate-{}", choice.name())).map_err(|e| e.to_string())?;
    let comm = Communicator::init(env, key, cfg).map_err(|e| format!("{}: {e}", choice.name()))?;
    if comm.size() != 2 {
        return Err(format!("run it on exactly 2 ranks, not {}", comm.size()));
    }
    let small = time_all_reduce(&comm, 8, 200)?;
    let big = time_all_reduce(&comm, BIG, 10)?;
    let alpha = small / 2.0;
    let beta = ((big - 2.0 * alpha - BIG as f64 / 2.0 * gamma) / BIG as f64).max(1e-12);
    if comm.rank() == 0 {
        println!(
            "# {:>4}: 8 B all-reduce {:.1} us -> alpha {:.1} us; {} MiB {:.2} ms -> beta {:.3} ns/B ({:.2} GB/s)",
            choice.name(),
            small * 1e6,
            alpha * 1e6,
            BIG >> 20,
            big * 1e3,
            beta * 1e9,
            1e-9 / beta
        );
    }
    Ok(Link { alpha, beta })
}

pub fn run() -> Result<(), String> {
    let gamma = measure_gamma()?;
    let tcp = link(TransportChoice::Tcp, gamma)?;
    let shm = link(TransportChoice::Shm, gamma)?;
    let model = CostModel { tcp, shm, gamma };
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    if env.rank != 0 {
        return Ok(());
    }
    println!(
        "# reduce: gamma {:.3} ns/B ({:.1} GB/s)",
        gamma * 1e9,
        1e-9 / gamma
    );
    let path =
        CostModel::default_path().ok_or("no place for the model: set GW_MODEL_FILE or HOME")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    }
    std::fs::write(&path, model.encode() + "\n")
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    println!("{}", model.encode());
    println!("# written to {}", path.display());
    Ok(())
}
