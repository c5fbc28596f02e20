//! `gwbench model`: the performance model on the command line. Reads the
//! files (or the shipped ones by name), predicts, and formats; the model
//! itself is gw-perfmodel.

use crate::args::{ModelOpts, PlannerArg};
use gw_collectives::Algo;
use gw_perfmodel::network::Network;
use gw_perfmodel::{Cluster, Options, Planner, Workload, predict, report, shipped, shipped_names};
use std::fmt::Write;

/// A file's text and the name errors call it by: a path that exists, else
/// a shipped file of that name.
fn load(arg: &str, ext: &str) -> Result<(String, String), String> {
    match std::fs::read_to_string(arg) {
        Ok(t) => Ok((arg.to_string(), t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match shipped(arg, ext) {
            Some(t) => Ok((format!("{arg} (shipped)"), t.to_string())),
            None => Err(format!(
                "{arg}: no such file, and no shipped .{ext} of that name ({})",
                shipped_names(ext).join(", ")
            )),
        },
        Err(e) => Err(format!("read {arg}: {e}")),
    }
}

pub fn run(o: &ModelOpts) -> Result<String, String> {
    let (cname, ctext) = load(&o.cluster, "cluster")?;
    let cluster = Cluster::parse(&cname, &ctext).map_err(|e| e.to_string())?;
    let algo = match o.algo.as_str() {
        "auto" => None,
        a => Some(Algo::parse(a).ok_or_else(|| format!("unknown algorithm {a:?}"))?),
    };
    if !o.allreduce.is_empty() {
        return Ok(allreduce(&cluster, algo, &o.allreduce, o.json));
    }
    let Some(m) = &o.model else {
        return Err("give --model FILE|NAME".into());
    };
    let (mname, mtext) = load(m, "model")?;
    let workload = Workload::parse(&mname, &mtext).map_err(|e| e.to_string())?;
    let opts = Options {
        global_batch: o.global_batch,
        planner: match o.planner {
            PlannerArg::Optperf => Planner::OptPerf,
            PlannerArg::Even => Planner::Even,
        },
        algo,
        bucket_bytes: o.bucket_bytes as u64,
        ..Options::default()
    };
    let p = predict(&workload, &cluster, &opts).map_err(|e| e.to_string())?;
    if o.json {
        let mut s = serde_json::to_string(&p).map_err(|e| format!("cannot encode: {e}"))?;
        s.push('\n');
        Ok(s)
    } else {
        Ok(report::text(&p))
    }
}

/// Predicted all-reduce times over the whole cluster, as nccl-tests would
/// report them: algbw = size / time, busbw = algbw × 2(n−1)/n.
fn allreduce(c: &Cluster, algo: Option<Algo>, sizes: &[usize], json: bool) -> String {
    let net = Network::of(c);
    let n = net.n as f64;
    let rows: Vec<(usize, &'static str, f64)> = sizes
        .iter()
        .map(|&s| {
            let (a, t) = net.choose(algo, s as u64);
            (s, a.name(), t)
        })
        .collect();
    let bw = |s: usize, t: f64| if t > 0.0 { s as f64 / t / 1e9 } else { 0.0 };
    let mut o = String::new();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|&(s, a, t)| {
                serde_json::json!({
                    "bytes": s, "algo": a, "time_s": t,
                    "algbw_gbs": bw(s, t), "busbw_gbs": bw(s, t) * 2.0 * (n - 1.0) / n,
                })
            })
            .collect();
        let _ = writeln!(
            o,
            "{}",
            serde_json::json!({"cluster": c.name, "ranks": net.n, "allreduce": v})
        );
        return o;
    }
    let _ = writeln!(o, "# predicted all-reduce on {} ({} ranks)", c.name, net.n);
    let _ = writeln!(
        o,
        "#{:>11} {:>6} {:>12} {:>8} {:>8}",
        "size", "algo", "time(us)", "algbw", "busbw"
    );
    for (s, a, t) in rows {
        let _ = writeln!(
            o,
            "{s:>12} {a:>6} {:>12.2} {:>8.2} {:>8.2}",
            t * 1e6,
            bw(s, t),
            bw(s, t) * 2.0 * (n - 1.0) / n
        );
    }
    o
}
