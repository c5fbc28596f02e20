//! Times the simulator and one round's decision at scale, in a release
//! build: `cargo run --release -p gw-scheduler --example bench -- TRACE
//! CLUSTER [POLICY...]`, TRACE a file or `gen:N:SEED:RATE`. Prints the figures; asserts nothing about them,
//! since timings depend on the machine.

use gw_scheduler::{Cluster, Trace, policy, simulate};
use std::time::Instant;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace, cluster, policies @ ..] = &args[..] else {
        return Err("usage: bench TRACE CLUSTER [POLICY...]".into());
    };
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("cannot read {p}: {e}"));
    // `gen:N:SEED:RATE` generates the trace instead of reading one.
    let t = match trace
        .strip_prefix("gen:")
        .map(|g| g.split(':').collect::<Vec<_>>())
    {
        Some(g) if g.len() == 3 => {
            let bad = |w: &str| format!("bad {w} in {trace}");
            let n = g[0].parse().map_err(|_| bad("N"))?;
            let seed = g[1].parse().map_err(|_| bad("SEED"))?;
            let rate = g[2].parse().map_err(|_| bad("RATE"))?;
            gw_scheduler::generate(n, seed, rate)
        }
        _ => Trace::parse(trace, &read(trace)?).map_err(|e| e.to_string())?,
    };
    let c = Cluster::parse(cluster, &read(cluster)?).map_err(|e| e.to_string())?;
    let all: Vec<String> = policy::NAMES.iter().map(|s| s.to_string()).collect();
    let names = if policies.is_empty() {
        &all[..]
    } else {
        policies
    };
    for name in names {
        let mut p = policy::by_name(name)?;
        let clock = Instant::now();
        let r = simulate(&t, &c, p.as_mut(), 360.0, 1).map_err(|e| e.to_string())?;
        println!(
            "{name:<15} {} jobs, {} rounds in {:.2} s; decision {:.2} ms mean, {:.2} ms max; avg JCT {:.0} s, makespan {:.0} s, util {:.3}, queue {:.0} s, ftf {:.3}",
            r.jobs,
            r.rounds,
            clock.elapsed().as_secs_f64(),
            r.decide_ms.0,
            r.decide_ms.1,
            r.avg_jct_s,
            r.makespan_s,
            r.utilization,
            r.avg_queue_s,
            r.ftf
        );
    }
    Ok(())
}
