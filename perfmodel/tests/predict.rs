//! The step model against hand-worked cases, the shipped files, planning
//! under memory caps, and determinism.

use gw_collectives::Algo;
use gw_collectives::model::{Link, predict_levels};
use gw_perfmodel::network::Network;
use gw_perfmodel::{Cluster, Options, Planner, Unfit, Workload, predict, shipped};

const TWO_LAYERS: &str = "model name=two\n\
    train batch_per_device=1 dataset_samples=1000 state_bytes_per_param=0 update_bytes_per_param=4\n\
    layer name=out params=262144 flops=1e9\n\
    layer name=in params=262144 flops=3e9\n";

const PAIR: &str = "cluster name=pair\n\
    device type=g tflops=1 memory_gib=1 mem_gbytes_s=1 reduce_gbytes_s=1 price_per_hour=1.8\n\
    link level=node alpha_us=10 gbit_s=8\n\
    racks count=1 nodes=1 devices=2 type=g\n";

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-3)
}

#[test]
fn two_layers_on_two_devices_by_hand() {
    let w = Workload::parse("two", TWO_LAYERS).expect("model");
    let c = Cluster::parse("pair", PAIR).expect("cluster");
    let p = predict(&w, &c, &Options::default()).expect("prediction");
    // Forward 4 GFLOP at 1 TFLOP/s: 4 ms; backward 8 ms, 2 ms of it for
    // the output layer. Its 1 MiB bucket is ready at 6 ms, the input
    // layer's at 12 ms. A 1 MiB ring on 2 ranks: 2α + S·β + S/2·γ =
    // 20 µs + 1.048576 ms + 0.524288 ms = 1.592864 ms (rd, α + S(β+γ),
    // would take 2.107 ms). The first ends at 7.59 ms, hidden; the second
    // at 13.592864 ms: 1.592864 ms exposed. Then the update: 524,288
    // parameters × 4 bytes at 1 GB/s = 2.097152 ms.
    let ar = 20e-6 + 1.048576e-3 + 0.524288e-3;
    assert_eq!(p.buckets.len(), 2);
    assert!(
        p.buckets
            .iter()
            .all(|b| b.algo == "ring" && close(b.seconds, ar))
    );
    let b = &p.breakdown;
    assert!(
        close(b.forward_s, 4e-3) && close(b.backward_s, 8e-3),
        "{b:?}"
    );
    assert!(close(b.exposed_comm_s, ar), "{b:?}");
    assert!(close(b.update_s, 2.097152e-3), "{b:?}");
    assert_eq!((b.io_s, b.h2d_s), (0.0, 0.0));
    let step = 12e-3 + ar + 2.097152e-3;
    assert!(close(p.step_time_s, step), "{}", p.step_time_s);
    let parts = b.io_s + b.h2d_s + b.forward_s + b.backward_s + b.update_s + b.exposed_comm_s;
    assert!(close(parts, p.step_time_s));
    assert!(close(p.samples_per_s, 2.0 / step));
    // Alone, a device would take 12 ms + the update per sample.
    assert!(close(p.scaling_efficiency, (12e-3 + 2.097152e-3) / step));
    assert!(close(p.epoch_s, 1000.0 / (2.0 / step)));
    assert!(close(p.cost_per_epoch, p.epoch_s / 3600.0 * 3.6));
    assert_eq!(p.bottleneck, "compute");
    // One layer less overlap: a single 2 MiB bucket waits for the whole
    // backward pass.
    let o = Options {
        first_bucket_bytes: 4 << 20,
        ..Options::default()
    };
    let p1 = predict(&w, &c, &o).expect("prediction");
    assert_eq!(p1.buckets.len(), 1);
    assert!(p1.exposed_comm_s > p.exposed_comm_s);
}

#[test]
fn a_slow_link_makes_communication_the_bottleneck() {
    let w = Workload::parse("two", TWO_LAYERS).expect("model");
    let slow = PAIR.replace("gbit_s=8", "gbit_s=0.08");
    let c = Cluster::parse("pair", &slow).expect("cluster");
    let p = predict(&w, &c, &Options::default()).expect("prediction");
    assert_eq!(p.bottleneck, "communication");
    assert!(p.exposed_comm_s > 0.1, "{}", p.exposed_comm_s);
}

#[test]
fn the_shipped_files_parse_with_their_published_parameter_counts() {
    for (name, params) in [
        ("resnet50", 25_557_032),
        ("resnet101", 44_549_160),
        ("vgg16", 138_357_544),
        ("bert-base", 109_482_240),
        ("gpt2-small", 124_439_808),
    ] {
        let w = Workload::parse(name, shipped(name, "model").expect(name)).expect(name);
        assert_eq!(w.params(), params, "{name}");
    }
    for name in ["reference", "10k", "gavel", "goyal"] {
        let c = Cluster::parse(name, shipped(name, "cluster").expect(name)).expect(name);
        assert!(c.device_count() > 0);
    }
    let c = Cluster::parse("10k", shipped("10k", "cluster").expect("10k")).expect("10k");
    assert_eq!((c.device_count(), c.racks.len()), (10_000, 100));
}

fn shipped_pair(model: &str, cluster: &str) -> (Workload, Cluster) {
    let w = Workload::parse(model, shipped(model, "model").expect(model)).expect(model);
    let c = Cluster::parse(cluster, shipped(cluster, "cluster").expect(cluster)).expect(cluster);
    (w, c)
}

#[test]
fn same_inputs_give_the_same_json() {
    let (w, c) = shipped_pair("gpt2-small", "10k");
    let a = serde_json::to_string(&predict(&w, &c, &Options::default()).expect("a")).expect("json");
    let b = serde_json::to_string(&predict(&w, &c, &Options::default()).expect("b")).expect("json");
    assert_eq!(a, b);
    for key in [
        "step_time_s",
        "exposed_comm_s",
        "bottleneck",
        "samples_per_s",
        "scaling_efficiency",
        "cost_per_epoch",
    ] {
        assert!(a.contains(&format!("\"{key}\":")), "{key} in {a}");
    }
}

#[test]
fn optperf_beats_even_shares_on_mixed_devices_and_respects_memory() {
    let (w, c) = shipped_pair("resnet50", "gavel");
    let opt = predict(&w, &c, &Options::default()).expect("optperf");
    let even = predict(
        &w,
        &c,
        &Options {
            planner: Planner::Even,
            ..Options::default()
        },
    )
    .expect("even");
    assert!(
        opt.step_time_s < even.step_time_s,
        "{} vs {}",
        opt.step_time_s,
        even.step_time_s
    );
    assert_eq!(opt.global_batch, even.global_batch);
    let total: u64 = opt
        .batches
        .iter()
        .map(|b| b.devices as u64 * b.min_batch)
        .sum();
    assert!(total <= opt.global_batch);
    // A global batch the fast devices' memory cannot take alone: the
    // planner holds them at their cap and gives the rest to the others.
    let big = predict(
        &w,
        &c,
        &Options {
            global_batch: Some(36 * 189 + 36 * 189 + 36 * 100),
            ..Options::default()
        },
    )
    .expect("big");
    for b in &big.batches {
        assert!(b.max_batch <= b.memory_cap, "{b:?}");
    }
    let v100 = big
        .batches
        .iter()
        .find(|b| b.device == "v100")
        .expect("v100");
    assert_eq!(v100.max_batch, 189);
}

#[test]
fn what_does_not_fit_is_reported_not_predicted() {
    let (w, c) = shipped_pair("gpt2-small", "goyal");
    match predict(&w, &c, &Options::default()) {
        Err(Unfit::BatchTooLarge { global, most }) => assert_eq!((global, most), (2048, 1792)),
        other => panic!("{other:?}"),
    }
    let tiny = PAIR.replace("memory_gib=1 ", "memory_gib=0.001 ");
    let c = Cluster::parse("pair", &tiny).expect("cluster");
    let w = Workload::parse("two", TWO_LAYERS).expect("model");
    let e = predict(&w, &c, &Options::default()).expect_err("too large");
    assert!(matches!(e, Unfit::ModelTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("does not fit on a g"), "{e}");
    let e = predict(
        &w,
        &Cluster::parse("pair", PAIR).expect("cluster"),
        &Options {
            global_batch: Some(1),
            ..Options::default()
        },
    )
    .expect_err("one sample, two devices");
    assert!(matches!(e, Unfit::BatchTooSmall { .. }), "{e}");
}

#[test]
fn hier_simulation_equals_the_cost_formula_when_all_start_together() {
    let (_, c) = shipped_pair("resnet50", "reference");
    let gamma = c.devices[0].gamma;
    let net = Network::of(&c);
    let bytes = 64u64 << 20;
    let nodes = c.racks.iter().map(|r| r.len()).sum();
    let ends = net.hier_ends(&c, bytes, &vec![1.0; nodes]);
    let levels = net.levels(bytes);
    let t = predict_levels(&levels, gamma, bytes as usize);
    assert!(
        ends.iter().all(|&e| close(e - 1.0, t)),
        "{} vs {t}",
        ends[0] - 1.0
    );
    assert_eq!(net.choose(Some(Algo::Hier), bytes).1, t);
    // The levels are node (8 per node), rack (16), spine (64), and a
    // device's share of the node's eight 200 Gb/s NICs across the spine is
    // halved by the oversubscription.
    let sizes: Vec<usize> = levels.iter().map(|l| l.ranks).collect();
    assert_eq!(sizes, [8, 16, 64]);
    let Link { beta, .. } = levels[2].link;
    assert!(close(beta, 8.0 / (8.0 * 25e9 / 2.0)), "{beta}");
    // A late node delays everyone by at most its lateness.
    let mut ready = vec![1.0; nodes];
    ready[5] = 1.5;
    let late = net.hier_ends(&c, bytes, &ready);
    assert!(late.iter().all(|&e| e > 1.0 + t && e <= 1.5 + t + 1e-12));
}

/// Exhaustive check of the capped planner on small cases: no split of the
/// global batch within the caps finishes the slowest rank sooner.
#[test]
fn capped_optperf_is_optimal_on_small_cases() {
    let text = "cluster name=mix\n\
        device type=fast tflops=4 memory_gib=1 mem_gbytes_s=100\n\
        device type=slow tflops=1 memory_gib=2 mem_gbytes_s=100\n\
        link level=node alpha_us=1 gbit_s=100\n\
        link level=rack alpha_us=1 gbit_s=100\n\
        racks count=1 nodes=1 devices=2 type=fast\n\
        node rack=0 devices=1 type=slow\n";
    let c = Cluster::parse("mix", text).expect("cluster");
    for act_mb in [50u64, 100, 200] {
        let model = format!(
            "model name=m\nsample activation_bytes={}\ntrain dataset_samples=10\nlayer name=l params=1000 flops=1e9\n",
            act_mb << 20
        );
        let w = Workload::parse("m", &model).expect("model");
        let caps: Vec<u64> = [1.0f64, 1.0, 2.0]
            .iter()
            .map(|g| {
                ((g * (1u64 << 30) as f64 - w.static_bytes()) / (act_mb << 20) as f64).floor()
                    as u64
            })
            .collect();
        let speed = [4.0, 4.0, 1.0];
        for global in 3..=(caps.iter().sum::<u64>()).min(60) {
            let p = predict(
                &w,
                &c,
                &Options {
                    global_batch: Some(global),
                    ..Options::default()
                },
            )
            .expect("fits");
            let mut best = f64::INFINITY;
            for a in 1..=caps[0] {
                for b in 1..=caps[1] {
                    if a + b >= global {
                        continue;
                    }
                    let s = global - a - b;
                    if s > caps[2] {
                        continue;
                    }
                    let t = [a, b, s]
                        .iter()
                        .zip(speed)
                        .map(|(&n, v)| n as f64 * 3e9 / (v * 1e12))
                        .fold(0.0, f64::max);
                    best = best.min(t);
                }
            }
            let got = p.breakdown.forward_s + p.breakdown.backward_s;
            assert!(
                close(got, best),
                "act {act_mb} MB, global {global}: {got} vs {best}"
            );
        }
    }
}
