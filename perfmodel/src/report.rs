//! The prediction for people: a few aligned lines, figures with units.

use crate::predict::Prediction;
use std::fmt::Write;

fn time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

pub fn text(p: &Prediction) -> String {
    let mut o = String::new();
    let b = &p.breakdown;
    let _ = writeln!(
        o,
        "# {} on {}: {} devices, global batch {}, planner {}",
        p.model, p.cluster, p.devices, p.global_batch, p.planner
    );
    for d in &p.batches {
        let _ = writeln!(
            o,
            "#   {:>6} x{:<6} local batch {}..{} (memory holds {})",
            d.device, d.devices, d.min_batch, d.max_batch, d.memory_cap
        );
    }
    let _ = writeln!(o, "step time          {}", time(p.step_time_s));
    for (name, v) in [
        ("  io (exposed)", b.io_s),
        ("  host to device", b.h2d_s),
        ("  forward", b.forward_s),
        ("  backward", b.backward_s),
        ("  update", b.update_s),
        ("  comm (exposed)", b.exposed_comm_s),
    ] {
        let _ = writeln!(
            o,
            "{name:<18} {:>12} {:>5.1}%",
            time(v),
            100.0 * v / p.step_time_s
        );
    }
    let algos: Vec<String> = p
        .buckets
        .iter()
        .map(|k| format!("{}:{}", k.bytes, k.algo))
        .collect();
    let _ = writeln!(
        o,
        "all-reduce total   {} in {} buckets ({})",
        time(p.comm_total_s),
        p.buckets.len(),
        if algos.len() <= 6 {
            algos.join(" ")
        } else {
            format!("{} ... {}", algos[0], algos[algos.len() - 1])
        }
    );
    let _ = writeln!(o, "bottleneck         {}", p.bottleneck);
    let _ = writeln!(o, "samples/s          {:.1}", p.samples_per_s);
    let _ = writeln!(o, "scaling efficiency {:.1}%", 100.0 * p.scaling_efficiency);
    let _ = writeln!(o, "epoch              {}", time(p.epoch_s));
    let _ = writeln!(
        o,
        "cost per epoch     ${:.2} at ${:.2}/h",
        p.cost_per_epoch, p.price_per_hour
    );
    match p.samples_per_dollar {
        Some(x) => {
            let _ = writeln!(o, "samples per dollar {x:.0}");
        }
        None => {
            let _ = writeln!(o, "samples per dollar (no prices in the cluster file)");
        }
    }
    o
}
