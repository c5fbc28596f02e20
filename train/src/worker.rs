//! The data-parallel training loop of one rank.
//!
//! Each step: get the plan (this rank's local batch b_i, where its samples
//! start, and its weight r_i = b_i / B), compute the mean gradient over its
//! b_i samples of the step's global batch, combine the ranks' gradients with
//! the weighted all-reduce Σ r_i · g_i (which is exactly the mean gradient of
//! the whole global batch however it was split), take an SGD step, and report
//! the step's timings. Because the samples are a pure function of their index
//! and every rank starts from the same seed, two runs with the same global
//! batches end with the same parameters (to rounding) whatever the split.
//!
//! A job the job server's scheduling policy preempts saves a checkpoint
//! (`--checkpoint DIR`) when its next step's plan says so and exits 0; its
//! next placement starts at that step (`GW_RESUME_STEP`) from the
//! checkpoint, so the pair of runs computes exactly what one run would.
//!
//! A slow device is emulated honestly: the slow rank repeats its real
//! forward/backward `slowdown` times per sample and throws the extra results
//! away, so its compute time really scales with its local batch.

use crate::checkpoint::{self, Checkpoint};
use crate::data::Dataset;
use crate::mlp::{Mlp, Workspace};
use crate::plan::{PlanSource, check_plan, check_tiling};
use crate::step::{StepClient, StepReport};
pub use crate::stop::Stop;
use gw_collectives::{Algo, Communicator, DType, OpKind, RawOp, RedOp};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// The worker's settings (command-line flags).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub steps: u64,
    pub lr: f64,
    pub seed: u64,
    pub dims: Vec<usize>,
    /// Global batch when there is no job server (the server's plan wins otherwise).
    pub global_batch: u64,
    pub slow_rank: Option<u32>,
    pub slowdown: u32,
    pub out: Option<PathBuf>,
    /// Where a preempted job saves its state and resumes from.
    pub checkpoint: Option<PathBuf>,
    /// Rank 0 prints progress every this many steps (0: never).
    pub print_every: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 100,
            lr: 0.1,
            seed: 1,
            dims: vec![32, 128, 128, 10],
            global_batch: 512,
            slow_rank: None,
            slowdown: 1,
            out: None,
            checkpoint: None,
            print_every: 10,
        }
    }
}

/// Values each rank contributes to a step's statistics: local batch,
/// offset, weight, step, compute, comm and plan times.
const STATS: usize = 7;

/// One line of rank 0's `steps.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepLog {
    pub step: u64,
    pub global_batch: u64,
    /// Every rank's local batch, in rank order.
    pub local_batches: Vec<u64>,
    pub weights: Vec<f64>,
    /// Slowest rank's wall time of the step, seconds.
    pub step_s: f64,
    pub compute_s: Vec<f64>,
    pub comm_s: Vec<f64>,
    /// Time each rank waited for its plan (the step protocol's cost).
    #[serde(default)]
    pub plan_s: Vec<f64>,
    pub predicted_step_s: Option<f64>,
    pub algo: String,
    /// Mean loss over the global batch, before this step's update.
    pub loss: f64,
    /// |g|² of the combined gradient.
    pub grad_sq: f64,
}

/// Adds the gradient of samples `first..first + count` to `grad` (a sum, not
/// a mean) and returns their summed loss. With `reps > 1` all of a sample's
/// work (making it, forward, backward) is done `reps` times and only the
/// first result counts, so the rank is `reps` times slower per sample.
///
/// The repeats are whole passes over the samples after the real one: a
/// sample redone straight after itself cost about 12% less, the core still
/// warm from doing it, so three interleaved passes took 2.78× one pass's
/// CPU time; three whole passes take 3.0×.
#[allow(clippy::too_many_arguments)]
pub fn local_gradient(
    mlp: &Mlp,
    data: &Dataset,
    params: &[f64],
    first: u64,
    count: u64,
    reps: u32,
    grad: &mut [f64],
    scratch: &mut [f64],
    ws: &mut Workspace,
) -> f64 {
    let mut x = vec![0.0; mlp.inputs()];
    let mut x_extra = vec![0.0; mlp.inputs()];
    let mut loss = 0.0;
    for k in first..first + count {
        let label = data.sample(k, &mut x);
        loss += mlp.accumulate(params, &x, label, grad, ws);
    }
    for _ in 1..reps {
        for k in first..first + count {
            // black_box: the repeat must really be computed, not reused.
            let again = data.sample(std::hint::black_box(k), &mut x_extra);
            let l = mlp.accumulate(params, &x_extra, again, scratch, ws);
            std::hint::black_box(l);
        }
    }
    if reps > 1 {
        std::hint::black_box(&mut *scratch);
        scratch.fill(0.0);
    }
    loss
}

/// `buf = Σ over ranks of weight_r · buf_r` (f64 sum), with the algorithm the
/// plan names ("auto" lets the communicator choose).
pub fn reduce_weighted(
    comm: &Communicator,
    buf: &mut [f64],
    weight: f64,
    algo: &str,
) -> Result<(), String> {
    if algo == "auto" {
        return comm
            .all_reduce_weighted_in_place(buf, weight)
            .map_err(|e| format!("all-reducing the gradient: {e}"));
    }
    let a = Algo::parse(algo).ok_or_else(|| {
        format!("the plan asks for all-reduce algorithm {algo:?} (known: auto, ring, tree, rhd)")
    })?;
    let p = buf.as_mut_ptr() as *mut u8;
    let op = RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::F64,
        redop: RedOp::Sum,
        count: buf.len(),
        root: 0,
        send: p,
        recv: p,
        weight: Some(weight),
    };
    // SAFETY: in-place all-reduce over `buf`, which is borrowed mutably for
    // the whole call and not touched until the handle has completed.
    unsafe { comm.run_raw(op, Some(a)) }
        .map_err(|e| format!("all-reducing the gradient ({algo}): {e}"))
}

/// FNV-1a over the parameters' bits: ranks compare it at the end.
pub fn params_hash(p: &[f64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in p {
        for b in v.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Parameters as raw little-endian f64.
pub fn write_params(path: &std::path::Path, p: &[f64]) -> Result<(), String> {
    let mut bytes = Vec::with_capacity(p.len() * 8);
    for v in p {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}

pub fn read_params(path: &std::path::Path) -> Result<Vec<f64>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    if bytes.len() % 8 != 0 {
        return Err(format!(
            "{}: {} bytes is not a whole number of f64",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            f64::from_le_bytes(a)
        })
        .collect())
}

/// Files this rank writes under `--out`.
struct Outputs {
    dir: PathBuf,
    rank_log: std::fs::File,
    steps: Option<std::fs::File>,
}

impl Outputs {
    /// A resumed run (`append`) goes on with the logs its earlier
    /// placements wrote, so that they hold every step once.
    fn open(dir: &std::path::Path, rank: u32, append: bool) -> Result<Outputs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let create = |name: String| {
            let p = dir.join(name);
            std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(&p)
                .map_err(|e| format!("creating {}: {e}", p.display()))
        };
        Ok(Outputs {
            dir: dir.to_path_buf(),
            rank_log: create(format!("steps-rank{rank}.log"))?,
            steps: if rank == 0 {
                Some(create("steps.jsonl".into())?)
            } else {
                None
            },
        })
    }
}

/// Runs the training loop of this rank (the communicator comes from the
/// launch environment; the plans from the job server when `GW_JOB_SERVER` is
/// set, else the even split of `cfg.global_batch`).
pub fn run(cfg: &TrainConfig) -> Result<(), Stop> {
    let comm = Communicator::from_env().map_err(|e| format!("joining the job: {e}"))?;
    let (rank, world) = (comm.rank(), comm.size());
    let source = match StepClient::from_env_with_rank(rank) {
        Ok(Some(c)) => PlanSource::Server(c),
        Ok(None) => PlanSource::Local {
            global_batch: cfg.global_batch,
            rank,
            world,
        },
        Err(e) => return Err(Stop::Failed(format!("connecting to the job server: {e}"))),
    };
    train(&comm, source, cfg)
}

/// The loop itself, on a given communicator and plan source.
pub fn train(comm: &Communicator, mut source: PlanSource, cfg: &TrainConfig) -> Result<(), Stop> {
    let (rank, world) = (comm.rank(), comm.size());
    let mlp = Mlp::new(&cfg.dims)?;
    let data = Dataset::new(cfg.seed, mlp.inputs(), mlp.classes());
    let mut params = mlp.init(cfg.seed);
    let n = mlp.len();
    let start = source.first_step();
    let mut base = 0u64;
    if start > 0 {
        let dir = cfg.checkpoint.as_ref().ok_or_else(|| {
            format!(
                "the job server resumes this job at step {start} (GW_RESUME_STEP), but gwtrain \
                 was started without --checkpoint DIR to resume from"
            )
        })?;
        let c = checkpoint::read_for(dir, start, cfg.seed, n)?;
        params = c.params;
        base = c.base;
    }
    let reps = if cfg.slow_rank == Some(rank) {
        cfg.slowdown.max(1)
    } else {
        1
    };
    let mut out = match &cfg.out {
        Some(d) => Some(Outputs::open(d, rank, start > 0)?),
        None => None,
    };
    // The gradient, then the local mean loss: one weighted all-reduce
    // combines both (Σ r_i · loss_i is the global batch's mean loss).
    let mut buf = vec![0.0; n + 1];
    let mut scratch = if reps > 1 { vec![0.0; n] } else { Vec::new() };
    let mut ws = mlp.workspace();
    let mut stats = vec![0.0f64; STATS * world as usize];
    if rank == 0 {
        println!(
            "gwtrain: {world} rank(s), transports {}, MLP {:?} ({n} parameters), {} steps, lr {}, plans from {}",
            comm.transport_summary(),
            cfg.dims,
            cfg.steps,
            cfg.lr,
            if source.is_server() {
                "the job server"
            } else {
                "the even split"
            }
        );
    }
    if rank == 0 && start > 0 {
        println!("gwtrain: resuming at step {start} from its checkpoint");
    }
    if reps > 1 {
        println!("gwtrain: rank {rank} repeats its compute {reps}× (slowdown)");
    }
    for s in start..cfg.steps {
        let t0 = Instant::now();
        let plan = match source.begin(s) {
            Err(Stop::Preempted { step }) => {
                return Err(save_checkpoint(comm, cfg, step, base, &params));
            }
            r => r?,
        };
        let plan_s = t0.elapsed().as_secs_f64();
        check_plan(&plan, s)?;
        let b = plan.local_batch;
        let tc = Instant::now();
        buf.fill(0.0);
        let loss_sum = local_gradient(
            &mlp,
            &data,
            &params,
            base + plan.offset,
            b,
            reps,
            &mut buf[..n],
            &mut scratch,
            &mut ws,
        );
        if b > 0 {
            let inv = 1.0 / b as f64;
            for v in &mut buf[..n] {
                *v *= inv;
            }
            buf[n] = loss_sum * inv;
        }
        let local_sq: f64 = buf[..n].iter().map(|v| v * v).sum();
        let compute_s = tc.elapsed().as_secs_f64();
        gw_collectives::trace_span("compute", tc, s);
        let tm = Instant::now();
        reduce_weighted(comm, &mut buf, plan.weight, &plan.algo)?;
        let comm_s = tm.elapsed().as_secs_f64();
        let global_sq: f64 = buf[..n].iter().map(|v| v * v).sum();
        let loss = buf[n];
        for (p, g) in params.iter_mut().zip(&buf[..n]) {
            *p -= cfg.lr * g;
        }
        let step_s = t0.elapsed().as_secs_f64();

        // Everyone's share and timings, to check the plans agree and for the log.
        let mine = [
            b as f64,
            plan.offset as f64,
            plan.weight,
            step_s,
            compute_s,
            comm_s,
            plan_s,
        ];
        comm.all_gather(&mine, &mut stats)
            .map_err(|e| format!("gathering step {s}'s statistics: {e}"))?;
        let rows: Vec<&[f64]> = stats.chunks_exact(STATS).collect();
        let shares: Vec<(u64, u64, f64)> = rows
            .iter()
            .map(|r| (r[0] as u64, r[1] as u64, r[2]))
            .collect();
        check_tiling(s, plan.global_batch, &shares)?;
        base += plan.global_batch;

        if let Some(o) = out.as_mut() {
            writeln!(o.rank_log, "{s}")
                .and_then(|_| o.rank_log.flush())
                .map_err(|e| format!("writing the step log: {e}"))?;
            if let Some(f) = o.steps.as_mut() {
                let line = StepLog {
                    step: s,
                    global_batch: plan.global_batch,
                    local_batches: shares.iter().map(|x| x.0).collect(),
                    weights: shares.iter().map(|x| x.2).collect(),
                    step_s: rows.iter().map(|r| r[3]).fold(0.0, f64::max),
                    compute_s: rows.iter().map(|r| r[4]).collect(),
                    comm_s: rows.iter().map(|r| r[5]).collect(),
                    plan_s: rows.iter().map(|r| r[6]).collect(),
                    predicted_step_s: plan.predicted_step_s,
                    algo: plan.algo.clone(),
                    loss,
                    grad_sq: global_sq,
                };
                let text = serde_json::to_string(&line)
                    .map_err(|e| format!("encoding the step log: {e}"))?;
                writeln!(f, "{text}")
                    .and_then(|_| f.flush())
                    .map_err(|e| format!("writing steps.jsonl: {e}"))?;
            }
        }
        if rank == 0 && cfg.print_every > 0 && (s % cfg.print_every == 0 || s + 1 == cfg.steps) {
            let step_max = rows.iter().map(|r| r[3]).fold(0.0, f64::max);
            let pred = plan
                .predicted_step_s
                .map(|p| format!(" (predicted {p:.4}s)"))
                .unwrap_or_default();
            println!(
                "step {s:>5}  loss {loss:.4}  batches {:?}  step {step_max:.4}s{pred}",
                shares.iter().map(|x| x.0).collect::<Vec<_>>()
            );
        }
        let report = StepReport {
            samples: b,
            compute_s,
            comm_s,
            step_s,
            local_grad_sq: Some(local_sq),
            global_grad_sq: Some(global_sq),
        };
        if source.end(s, &report)? {
            return Err(Stop::ByServer {
                step: s,
                reason: "the job server asked the workers to stop".into(),
            });
        }
    }

    let h = same_params(comm, &params, "final")?;
    if rank == 0 {
        if let Some(o) = &out {
            write_params(&o.dir.join("params.bin"), &params)?;
        }
        println!(
            "gwtrain: done, {} steps, parameters hash {:016x}",
            cfg.steps, h
        );
    }
    Ok(())
}

/// Every rank must hold the same model: compares the parameters' hashes,
/// and returns this rank's.
fn same_params(comm: &Communicator, params: &[f64], when: &str) -> Result<u64, Stop> {
    let h = params_hash(params) as i64;
    let mut all = vec![0i64; comm.size() as usize];
    comm.all_gather(&[h], &mut all)
        .map_err(|e| format!("comparing the {when} parameters: {e}"))?;
    if let Some(r) = all.iter().position(|&x| x != h) {
        return Err(Stop::Failed(format!(
            "rank {r}'s {when} parameters differ from rank {}'s",
            comm.rank()
        )));
    }
    Ok(h as u64)
}

/// The job server preempts the job at `step`: rank 0 saves the state after
/// step - 1 (every rank holds the same, checked first) and every rank stops.
/// The barrier keeps a rank from exiting 0, the signal that the job may be
/// placed again, before the checkpoint is on disk.
fn save_checkpoint(
    comm: &Communicator,
    cfg: &TrainConfig,
    step: u64,
    base: u64,
    params: &[f64],
) -> Stop {
    let Some(dir) = &cfg.checkpoint else {
        return Stop::Failed(format!(
            "the job server preempted the job at step {step}, but gwtrain was started \
             without --checkpoint DIR to save its state in"
        ));
    };
    let saved = same_params(comm, params, "preempted").and_then(|_| {
        if comm.rank() == 0 {
            let c = Checkpoint {
                step,
                base,
                seed: cfg.seed,
                params: params.to_vec(),
            };
            checkpoint::write(dir, &c)?;
            println!(
                "gwtrain: preempted at step {step}; state saved in {}",
                checkpoint::path(dir).display()
            );
        }
        comm.barrier()
            .map_err(|e| Stop::Failed(format!("waiting for the checkpoint: {e}")))
    });
    match saved {
        Ok(()) => Stop::Preempted { step },
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain single-process SGD with the worker's gradient: the loss must fall.
    #[test]
    fn loss_goes_down() {
        let mlp = Mlp::new(&[32, 64, 10]).expect("dims");
        let data = Dataset::new(5, 32, 10);
        let mut p = mlp.init(5);
        let mut ws = mlp.workspace();
        let mut g = vec![0.0; mlp.len()];
        let b = 32u64;
        let mut losses = Vec::new();
        for s in 0..300u64 {
            g.fill(0.0);
            let l = local_gradient(&mlp, &data, &p, s * b, b, 1, &mut g, &mut [], &mut ws);
            losses.push(l / b as f64);
            for (pv, gv) in p.iter_mut().zip(&g) {
                *pv -= 0.2 * gv / b as f64;
            }
        }
        let first: f64 = losses[..20].iter().sum::<f64>() / 20.0;
        let last: f64 = losses[280..].iter().sum::<f64>() / 20.0;
        assert!(last < 0.6 * first, "loss {first} -> {last}");
    }

    /// Repeating the compute (the slowdown) must not change the gradient.
    #[test]
    fn slowdown_repeats_do_not_change_the_result() {
        let mlp = Mlp::new(&[8, 16, 4]).expect("dims");
        let data = Dataset::new(2, 8, 4);
        let p = mlp.init(2);
        let mut ws = mlp.workspace();
        let (mut g1, mut g3) = (vec![0.0; mlp.len()], vec![0.0; mlp.len()]);
        let mut scratch = vec![0.0; mlp.len()];
        let l1 = local_gradient(&mlp, &data, &p, 10, 7, 1, &mut g1, &mut [], &mut ws);
        let l3 = local_gradient(&mlp, &data, &p, 10, 7, 3, &mut g3, &mut scratch, &mut ws);
        assert_eq!(l1.to_bits(), l3.to_bits());
        assert_eq!(g1, g3);
    }

    #[test]
    fn params_round_trip_through_a_file() {
        let dir = std::env::temp_dir().join(format!("gwtrain-params-{}", std::process::id()));
        let p = vec![1.5, -0.0, f64::MIN_POSITIVE, 1e300];
        write_params(&dir, &p).expect("write");
        let q = read_params(&dir).expect("read");
        let _ = std::fs::remove_file(&dir);
        assert_eq!(p, q);
        assert_eq!(params_hash(&p), params_hash(&q));
    }
}
