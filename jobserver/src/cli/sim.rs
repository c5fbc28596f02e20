//! Runs `gwjob simulate` and `gwjob gen-trace`: reads the files, calls
//! `gw_scheduler`, and returns the text to print or the one-line reason it
//! failed (a file that cannot be read, a bad line, a job that can never
//! run), which the binary prints after `gwjob simulate: ` and exits 1 with.

use crate::cli::sim_args::{GenTrace, Simulate};
use gw_scheduler::{Cluster, Trace, generate, policy, simulate};
use std::path::Path;

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

pub fn run_simulate(s: &Simulate) -> Result<String, String> {
    let trace = Trace::parse(&s.trace.display().to_string(), &read(&s.trace)?)
        .map_err(|e| e.to_string())?;
    let cluster = Cluster::parse(&s.cluster.display().to_string(), &read(&s.cluster)?)
        .map_err(|e| e.to_string())?;
    let mut p = policy::by_name(&s.policy)?;
    let report =
        simulate(&trace, &cluster, p.as_mut(), s.round_s, s.seed).map_err(|e| e.to_string())?;
    Ok(if s.json {
        report.json()
    } else {
        report.table()
    })
}

pub fn run_gen_trace(g: &GenTrace) -> Result<String, String> {
    let text = generate(g.jobs, g.seed, g.rate).render();
    match &g.out {
        None => Ok(text),
        Some(path) => {
            std::fs::write(path, text)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(format!("{} jobs written to {}\n", g.jobs, path.display()))
        }
    }
}
