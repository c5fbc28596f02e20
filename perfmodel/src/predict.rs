//! One synchronized SGD step on a whole cluster, rank by rank (Shi et al.'s
//! t_iter = t_io + t_h2d + t_f + t_b + t_u + exposed t_comm).
//!
//! Every device is a rank with its own local batch (from the OptPerf
//! planner, or even shares), its own forward and backward time, and its own
//! moment each gradient bucket becomes ready. Each bucket is all-reduced
//! when the ranks it waits for are ready (see [`crate::network`]), buckets
//! one after another; the optimizer step follows the last one. The data
//! loader reads the next batch while this step computes, so storage only
//! shows where it is slower than the rest of the step.

use crate::bucket::{self, Bucket};
use crate::cluster::Cluster;
use crate::network::Network;
use crate::workload::Workload;
use gw_collectives::Algo;
use gw_planner::{Linear, plan_even, plan_optperf};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planner {
    OptPerf,
    Even,
}

impl Planner {
    pub fn name(self) -> &'static str {
        match self {
            Planner::OptPerf => "optperf",
            Planner::Even => "even",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Samples per step; default the model's batch per device × devices.
    pub global_batch: Option<u64>,
    pub planner: Planner,
    /// None: the live chooser picks per bucket.
    pub algo: Option<Algo>,
    pub bucket_bytes: u64,
    pub first_bucket_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            global_batch: None,
            planner: Planner::OptPerf,
            algo: None,
            bucket_bytes: bucket::BUCKET_BYTES,
            first_bucket_bytes: bucket::FIRST_BUCKET_BYTES,
        }
    }
}

/// Why no step time can be predicted.
#[derive(Clone, Debug, PartialEq)]
pub enum Unfit {
    /// Weights, gradients and optimizer state alone exceed a device.
    ModelTooLarge {
        device: String,
        need_bytes: f64,
        have_bytes: f64,
    },
    /// The devices cannot hold the global batch's activations.
    BatchTooLarge { global: u64, most: u64 },
    /// Fewer samples than devices (every rank computes at least one).
    BatchTooSmall { global: u64, devices: usize },
    /// The planner refused (its message).
    Plan(String),
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        match self {
            Unfit::ModelTooLarge {
                device,
                need_bytes,
                have_bytes,
            } => write!(
                f,
                "the model does not fit on a {device}: weights, gradients and optimizer state need {:.2} GiB, the device has {:.2} GiB",
                gib(*need_bytes),
                gib(*have_bytes)
            ),
            Unfit::BatchTooLarge { global, most } => write!(
                f,
                "a global batch of {global} does not fit in the cluster's memory: at most {most} samples"
            ),
            Unfit::BatchTooSmall { global, devices } => write!(
                f,
                "a global batch of {global} leaves some of the {devices} devices without a sample"
            ),
            Unfit::Plan(m) => write!(f, "no plan: {m}"),
        }
    }
}

impl std::error::Error for Unfit {}

/// The critical rank's step, part by part; the parts add up to the step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Breakdown {
    pub io_s: f64,
    pub h2d_s: f64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub update_s: f64,
    pub exposed_comm_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketReport {
    pub bytes: u64,
    pub algo: &'static str,
    /// All-reduce time when every rank starts together.
    pub seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceBatches {
    pub device: String,
    pub devices: usize,
    pub min_batch: u64,
    pub max_batch: u64,
    /// Largest local batch its memory holds.
    pub memory_cap: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub model: String,
    pub cluster: String,
    pub devices: usize,
    pub global_batch: u64,
    pub planner: &'static str,
    pub step_time_s: f64,
    pub exposed_comm_s: f64,
    /// Sum of the buckets' all-reduce times, hidden or not.
    pub comm_total_s: f64,
    pub bottleneck: &'static str,
    pub samples_per_s: f64,
    /// Throughput over the sum of what each device would do alone with the
    /// same local batch and no communication.
    pub scaling_efficiency: f64,
    pub epoch_s: f64,
    pub price_per_hour: f64,
    pub cost_per_epoch: f64,
    /// None when the cluster file gives no prices.
    pub samples_per_dollar: Option<f64>,
    pub breakdown: Breakdown,
    pub buckets: Vec<BucketReport>,
    pub batches: Vec<DeviceBatches>,
}

/// One device type's per-sample and per-step costs for this model.
struct Costs {
    /// Forward+backward seconds for a local batch.
    compute: Linear,
    forward_share: f64,
    h2d_per_sample: f64,
    update_s: f64,
    cap: u64,
}

fn costs(w: &Workload, c: &Cluster) -> Result<Vec<Costs>, Unfit> {
    let (f, b) = (w.forward_flops(), w.backward_flops());
    let forward_share = if f + b > 0.0 { f / (f + b) } else { 1.0 / 3.0 };
    c.devices
        .iter()
        .map(|d| {
            let mut compute = w.measured_fit(&d.name).unwrap_or(Linear {
                a: (f + b) / d.flops,
                c: 0.0,
            });
            compute.c += d.launch_s;
            let free = d.memory_bytes - w.static_bytes();
            let used = c
                .racks
                .iter()
                .flatten()
                .any(|n| c.devices[n.device].name == d.name);
            if free <= 0.0 && used {
                return Err(Unfit::ModelTooLarge {
                    device: d.name.clone(),
                    need_bytes: w.static_bytes(),
                    have_bytes: d.memory_bytes,
                });
            }
            let cap = if w.activation_bytes > 0.0 {
                (free.max(0.0) / w.activation_bytes)
                    .floor()
                    .min(u32::MAX as f64) as u64
            } else {
                u32::MAX as u64
            };
            Ok(Costs {
                compute,
                forward_share,
                h2d_per_sample: w.input_bytes / d.h2d_bytes_s,
                update_s: w.params() as f64 * w.update_bytes_per_param / d.mem_bytes_s,
                cap,
            })
        })
        .collect()
}

/// Local batches per rank under per-rank memory caps. OptPerf's water
/// level only rises when a rank is held at its cap, so clamping the ranks
/// a plan puts above their caps and re-planning the rest stays optimal.
fn plan(models: &[Linear], caps: &[u64], global: u64, planner: Planner) -> Result<Vec<u64>, Unfit> {
    let n = models.len();
    let most: u64 = caps.iter().fold(0u64, |s, &c| s.saturating_add(c));
    if global > most {
        return Err(Unfit::BatchTooLarge { global, most });
    }
    if global < n as u64 || caps.contains(&0) {
        return Err(Unfit::BatchTooSmall { global, devices: n });
    }
    let err = |e: gw_planner::PlanError| Unfit::Plan(e.to_string());
    if planner == Planner::Even {
        let lo = caps.iter().copied().min().unwrap_or(0);
        if global.div_ceil(n as u64) > lo {
            return Err(Unfit::BatchTooLarge {
                global,
                most: lo * n as u64,
            });
        }
        return plan_even(n, global, 1, lo).map_err(err);
    }
    let mut fixed: Vec<Option<u64>> = vec![None; n];
    loop {
        let free: Vec<usize> = (0..n).filter(|&i| fixed[i].is_none()).collect();
        let taken: u64 = fixed.iter().flatten().sum();
        let sub: Vec<Linear> = free.iter().map(|&i| models[i]).collect();
        let left = global - taken;
        let hi = free.iter().map(|&i| caps[i]).max().unwrap_or(1);
        let b = plan_optperf(&sub, left, 1, hi).map_err(err)?;
        let mut clamped = false;
        for (k, &i) in free.iter().enumerate() {
            if b[k] > caps[i] {
                fixed[i] = Some(caps[i]);
                clamped = true;
            }
        }
        if !clamped {
            let mut out: Vec<u64> = fixed.iter().map(|f| f.unwrap_or(0)).collect();
            for (k, &i) in free.iter().enumerate() {
                out[i] = b[k];
            }
            return Ok(out);
        }
    }
}

/// Predicts one step of `w` on `c`.
pub fn predict(w: &Workload, c: &Cluster, o: &Options) -> Result<Prediction, Unfit> {
    let per_type = costs(w, c)?;
    // Ranks: racks, then nodes, then devices, as a launcher numbers them.
    let mut rank_type = Vec::new();
    let mut rank_node = Vec::new();
    for (node, n) in c.racks.iter().flatten().enumerate() {
        for _ in 0..n.devices {
            rank_type.push(n.device);
            rank_node.push(node);
        }
    }
    let n = rank_type.len();
    let global = o.global_batch.unwrap_or(w.batch_per_device * n as u64);
    let models: Vec<Linear> = rank_type
        .iter()
        .map(|&t| {
            let k = &per_type[t];
            Linear {
                a: k.compute.a + k.h2d_per_sample,
                c: k.compute.c,
            }
        })
        .collect();
    let caps: Vec<u64> = rank_type.iter().map(|&t| per_type[t].cap).collect();
    let batch = plan(&models, &caps, global, o.planner)?;

    // Per rank: h2d, forward, backward, update.
    let mut parts = Vec::with_capacity(n);
    for (i, &t) in rank_type.iter().enumerate() {
        let k = &per_type[t];
        let fb = k.compute.time(batch[i]);
        parts.push([
            k.h2d_per_sample * batch[i] as f64,
            fb * k.forward_share,
            fb * (1.0 - k.forward_share),
            k.update_s,
        ]);
    }
    let compute_end: Vec<f64> = parts.iter().map(|p| p[0] + p[1] + p[2]).collect();
    let critical = (0..n).fold(0, |m, i| {
        if compute_end[i] > compute_end[m] {
            i
        } else {
            m
        }
    });

    let net = Network::of(c);
    let buckets = bucket::buckets(
        &w.layers,
        w.grad_bytes,
        o.first_bucket_bytes,
        o.bucket_bytes,
    );
    let nodes = c.racks.iter().map(|r| r.len()).sum::<usize>();
    let mut node_free = vec![0.0f64; nodes];
    let mut reports = Vec::with_capacity(buckets.len());
    for Bucket {
        bytes,
        ready_fraction,
    } in &buckets
    {
        let mut ready = node_free.clone();
        for i in 0..n {
            let p = &parts[i];
            let r = p[0] + p[1] + p[2] * ready_fraction;
            let slot = &mut ready[rank_node[i]];
            *slot = slot.max(r);
        }
        let (algo, seconds) = net.choose(o.algo, *bytes);
        if algo == Algo::Hier {
            node_free = net.hier_ends(c, *bytes, &ready);
        } else {
            let start = ready.iter().copied().fold(0.0, f64::max);
            node_free.iter_mut().for_each(|f| *f = start + seconds);
        }
        reports.push(BucketReport {
            bytes: *bytes,
            algo: algo.name(),
            seconds,
        });
    }
    let done_compute_update = (0..n)
        .map(|i| compute_end[i] + parts[i][3])
        .fold(0.0, f64::max);
    let step_no_io = (0..n)
        .map(|i| compute_end[i].max(node_free[rank_node[i]]) + parts[i][3])
        .fold(0.0, f64::max);
    // The loader reads a node's next batch during this step.
    let mut node_samples = vec![0u64; nodes];
    for i in 0..n {
        node_samples[rank_node[i]] += batch[i];
    }
    let io_raw = node_samples
        .iter()
        .map(|&s| s as f64 * w.read_bytes / c.storage_bytes_s)
        .fold(0.0, f64::max);
    let step = step_no_io.max(io_raw);
    let cp = &parts[critical];
    let breakdown = Breakdown {
        io_s: step - step_no_io,
        h2d_s: cp[0],
        forward_s: cp[1],
        backward_s: cp[2],
        update_s: done_compute_update - compute_end[critical],
        exposed_comm_s: step_no_io - done_compute_update,
    };
    let comm_total: f64 = reports.iter().map(|r| r.seconds).sum();
    let bottleneck = [
        ("io", io_raw),
        ("h2d", cp[0]),
        ("compute", cp[1] + cp[2]),
        ("update", breakdown.update_s),
        ("communication", comm_total),
    ]
    .into_iter()
    .fold(("compute", f64::NEG_INFINITY), |m, x| {
        if x.1 > m.1 { x } else { m }
    })
    .0;

    let samples_per_s = global as f64 / step;
    let alone: f64 = (0..n)
        .map(|i| {
            let io = batch[i] as f64 * w.read_bytes / c.storage_bytes_s;
            batch[i] as f64 / (compute_end[i] + parts[i][3]).max(io)
        })
        .sum();
    let price: f64 = rank_type.iter().map(|&t| c.devices[t].price_per_hour).sum();
    let epoch_s = w.dataset_samples as f64 / samples_per_s;
    let mut batches: Vec<DeviceBatches> = Vec::new();
    for (t, d) in c.devices.iter().enumerate() {
        let mine: Vec<u64> = (0..n)
            .filter(|&i| rank_type[i] == t)
            .map(|i| batch[i])
            .collect();
        if let (Some(&lo), Some(&hi)) = (mine.iter().min(), mine.iter().max()) {
            batches.push(DeviceBatches {
                device: d.name.clone(),
                devices: mine.len(),
                min_batch: lo,
                max_batch: hi,
                memory_cap: per_type[t].cap,
            });
        }
    }
    Ok(Prediction {
        model: w.name.clone(),
        cluster: c.name.clone(),
        devices: n,
        global_batch: global,
        planner: o.planner.name(),
        step_time_s: step,
        exposed_comm_s: breakdown.exposed_comm_s,
        comm_total_s: comm_total,
        bottleneck,
        samples_per_s,
        scaling_efficiency: samples_per_s / alone,
        epoch_s,
        price_per_hour: price,
        cost_per_epoch: epoch_s / 3600.0 * price,
        samples_per_dollar: (price > 0.0).then(|| samples_per_s * 3600.0 / price),
        breakdown,
        buckets: reports,
        batches,
    })
}
