//! `gwbench calibrate`: measures the cost model's parameters on this machine.
//!
//! The model (`gw_collectives::model`) prices a 2-rank ring all-reduce of S
//! bytes at `2α + S·β + S/2·γ`, so timing that all-reduce at 8 B and at
//! 8 MiB over each transport gives α and β directly, in the same terms the
//! algorithm choice uses; the same solve at six sizes from 64 KiB to 64 MiB
//! gives β's curve over size (cache-resident messages are cheaper per
//! byte); γ comes from timing the reduction kernel alone.
//! Rank 0 writes the result to the file every later job's rank 0 reads.

use crate::nccl::count_for_time;
use gw_collectives::model::{CostModel, Curve, Link};
use gw_collectives::reduce::Kernel;
use gw_collectives::{
    Algo, CommKey, Communicator, Config, DType, LaunchEnv, OpKind, RawOp, RedOp, TransportChoice,
};
use std::time::Instant;

const BIG: usize = 8 << 20;

/// Seconds per call of a 2-rank ring all-reduce of `bytes`, timed as
/// `gwbench -T` times it: a loop sized to about [`LOOP_SECONDS`] on the
/// slower rank ([`count_for_time`], the same count on both), run [`REPS`]
/// times after a barrier, per call, the slower rank's figure, median of
/// the loops. (Loops of a fixed count per size lasted from 2 to 130 ms,
/// so the short ones caught this shared machine's stalls unevenly.)
/// Timing single calls after a barrier measures waking a sleeping peer as
/// much as moving bytes (3× too slow for 1 MiB over TCP).
fn time_all_reduce(comm: &Communicator, bytes: usize) -> Result<f64, String> {
    let n = bytes / 4;
    let send = vec![1.0f32; n];
    let mut recv = vec![0.0f32; n];
    let mut one = || {
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
        // SAFETY: both buffers outlive the wait inside run_raw.
        unsafe { comm.run_raw(op, Some(Algo::Ring)) }
            .map_err(|e| format!("all-reduce of {bytes} B: {e}"))
    };
    let slowest = |mine: f64| -> Result<f64, String> {
        let mut max = [0.0f64];
        comm.all_reduce(&[mine], &mut max, RedOp::Max)
            .map_err(|e| format!("all-reduce of a timing: {e}"))?;
        Ok(max[0])
    };
    let mut timed = |k: usize| -> Result<f64, String> {
        let t0 = Instant::now();
        for _ in 0..k {
            one()?;
        }
        slowest(t0.elapsed().as_secs_f64())
    };
    // Sizing the loop is also its warm-up: TCP grows its windows, and the
    // pages of both buffers get mapped, before anything counts.
    let calls = count_for_time(LOOP_SECONDS, 2, &mut timed)?;
    let mut times = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        comm.barrier().map_err(|e| format!("barrier: {e}"))?;
        times.push(timed(calls)? / calls as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Each timed loop's length: seven of them per size, eight sizes per
/// transport, about 6 s in all.
const LOOP_SECONDS: f64 = 0.05;

const REPS: usize = 7;

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

/// Sizes at which β is measured for the link's curve.
const CURVE: [usize; 6] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

fn link(choice: TransportChoice, gamma: f64) -> Result<(Link, Curve), String> {
    let mut cfg = Config::default();
    cfg.transport.set(choice);
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    let key = CommKey::next(&format!("calibrate-{}", choice.name())).map_err(|e| e.to_string())?;
    let comm = Communicator::init(env, key, cfg).map_err(|e| format!("{}: {e}", choice.name()))?;
    if comm.size() != 2 {
        return Err(format!("run it on exactly 2 ranks, not {}", comm.size()));
    }
    let small = time_all_reduce(&comm, 8)?;
    let alpha = small / 2.0;
    // β at a size: what makes the model's 2-rank ring take the time
    // measured there. The curve is measured first, smallest size first,
    // and the 8 MiB point last, as gwbench sweeps sizes: with send buffers
    // of megabytes (GW_SOCKET_SEND_BUFFER_BYTES set high, or 0) a TCP
    // communicator that has run all-reduces of 2 MiB or more runs those of
    // 256 KiB to 1 MiB about 1.45× slower for the rest of its life
    // (docs/performance.md), and a curve measured after the 8 MiB loop
    // would predict that state, not the one an ascending benchmark meets.
    let solve = |t: f64, bytes: usize| {
        ((t - 2.0 * alpha - bytes as f64 / 2.0 * gamma) / bytes as f64).max(1e-13)
    };
    let mut points = Vec::with_capacity(CURVE.len());
    for bytes in CURVE {
        let t = time_all_reduce(&comm, bytes)?;
        points.push((bytes as u64, solve(t, bytes)));
    }
    let big = time_all_reduce(&comm, BIG)?;
    let beta = solve(big, BIG).max(1e-12);
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
        let shown: Vec<String> = points
            .iter()
            .map(|&(s, b)| format!("{}K {:.2}", s >> 10, 1e-9 / b))
            .collect();
        println!("# {:>4}: GB/s by size: {}", choice.name(), shown.join(", "));
    }
    let curve = Curve::new(&points).map_err(|e| format!("{}: curve: {e}", choice.name()))?;
    Ok((Link { alpha, beta }, curve))
}

pub fn run() -> Result<(), String> {
    let gamma = measure_gamma()?;
    let (tcp, tcp_curve) = link(TransportChoice::Tcp, gamma)?;
    let (shm, shm_curve) = link(TransportChoice::Shm, gamma)?;
    let model = CostModel {
        tcp,
        shm,
        gamma,
        tcp_curve,
        shm_curve,
    };
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
