//! No job finishes before it could have alone: without forked copies, a
//! job's rate is at most its true rate on its fastest type in the cluster
//! (a mix of types is slower, by OptPerf's plan; the simulator's true
//! rates are the declared T[j][k] within ±5%, see `sim.rs`), so it ends no
//! earlier than arrival + steps / (1.05 · max_k T[j][k]), and the makespan
//! no earlier than the latest such time. Checked for every policy that does not fork, on a
//! generated trace and on the shipped small and 1,000-job traces. A
//! simulator that let a job outrun its hardware would fail here; so
//! would one that credited a job before it arrived.

use gw_scheduler::policy::{self, NAMES};
use gw_scheduler::{Cluster, Trace, generate, simulate};

/// How far above the declared throughput the simulator's true rate may be.
const TRUE_RATE_SPREAD: f64 = 0.05;

fn shipped(name: &str) -> String {
    let path = format!("{}/../jobserver/traces/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Per job: the earliest it could finish alone on its fastest type here.
fn alone(trace: &Trace, cluster: &Cluster) -> Vec<f64> {
    trace
        .jobs
        .iter()
        .map(|j| {
            let best = j
                .tput
                .iter()
                .filter(|(ty, _)| cluster.types.iter().any(|c| &c.name == ty))
                .map(|(_, t)| *t)
                .fold(0.0f64, f64::max);
            j.arrival_s + j.steps as f64 / (best * (1.0 + TRUE_RATE_SPREAD))
        })
        .collect()
}

fn check(trace: &Trace, cluster: &Cluster, policies: &[&str], what: &str) {
    let bound = alone(trace, cluster);
    let latest = bound.iter().copied().fold(0.0f64, f64::max);
    for name in policies {
        let mut p = policy::by_name(name).expect("known");
        let r = simulate(trace, cluster, p.as_mut(), 360.0, 1).expect("simulates");
        assert_eq!(r.per_job.len(), trace.jobs.len(), "{what} {name}");
        for (o, b) in r.per_job.iter().zip(&bound) {
            assert!(
                o.finish_s >= b * (1.0 - 1e-9),
                "{what} {name}: job {} finished at {} s, before {b} s, its time alone on its fastest type",
                o.id,
                o.finish_s
            );
        }
        assert!(
            r.makespan_s >= latest * (1.0 - 1e-9),
            "{what} {name}: makespan {} s below the bound {latest} s",
            r.makespan_s
        );
    }
}

#[test]
fn no_job_outruns_its_fastest_type() {
    let forkless: Vec<&str> = NAMES.iter().copied().filter(|n| *n != "hadare").collect();
    let cluster = Cluster::parse(
        "test",
        "nodes type=v100 count=2 slots=4\nnodes type=p100 count=2 slots=4\nnodes type=k80 count=2 slots=4\n",
    )
    .expect("a good cluster");
    let mut t = generate(40, 5, 6.0);
    for j in &mut t.jobs {
        j.steps = j.steps.div_ceil(20);
    }
    check(&t, &cluster, &forkless, "generated");
    let small = Trace::parse("small-12.trace", &shipped("small-12.trace")).expect("parses");
    let small_c =
        Cluster::parse("cluster-small", &shipped("cluster-small.cluster")).expect("parses");
    check(&small, &small_c, &forkless, "small-12");
    // The 1,000-job trace with the fast policies (gavel's LP takes seconds there).
    let philly = Trace::parse("philly-1000.trace", &shipped("philly-1000.trace")).expect("parses");
    let gavel_c =
        Cluster::parse("cluster-gavel", &shipped("cluster-gavel.cluster")).expect("parses");
    check(&philly, &gavel_c, &["fifo", "hadar"], "philly-1000");
}
