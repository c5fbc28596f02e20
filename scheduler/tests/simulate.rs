//! The simulator end to end on generated traces: same seed, same bytes;
//! every job finishes credited with exactly its samples under every policy;
//! HadarE's copies process more samples than they are credited, never
//! fewer; and a job that can never run stops the simulation with its name.

use gw_scheduler::policy::{self, NAMES};
use gw_scheduler::{Cluster, SimError, Trace, generate, simulate};

fn cluster() -> Cluster {
    Cluster::parse(
        "test",
        "nodes type=v100 count=2 slots=4\nnodes type=p100 count=2 slots=4\nnodes type=k80 count=2 slots=4\n",
    )
    .expect("a good cluster")
}

fn trace(seed: u64) -> Trace {
    let mut t = generate(40, seed, 6.0);
    // Short jobs keep the test quick; the mix of sizes and types stays.
    for j in &mut t.jobs {
        j.steps = j.steps.div_ceil(20);
    }
    t
}

#[test]
fn same_seed_same_json() {
    for name in NAMES {
        let run = |seed| {
            let mut p = policy::by_name(name).expect("known");
            simulate(&trace(3), &cluster(), p.as_mut(), 360.0, seed)
                .expect("simulates")
                .json()
        };
        let a = run(11);
        assert_eq!(a, run(11), "{name}");
        assert_ne!(a, run(12), "{name}: the seed must matter");
        for key in gw_scheduler::report::REPORT_KEYS {
            assert!(
                a.contains(&format!("\"{key}\"")),
                "{name}: {key} missing in {a}"
            );
        }
    }
}

#[test]
fn every_job_finishes_with_exactly_its_samples() {
    let (t, c) = (trace(5), cluster());
    for name in NAMES {
        let mut p = policy::by_name(name).expect("known");
        let r = simulate(&t, &c, p.as_mut(), 360.0, 1).expect("simulates");
        assert_eq!(r.jobs, t.jobs.len());
        for o in &r.per_job {
            assert_eq!(o.samples_credited, o.samples_needed, "{name}: {}", o.id);
            assert!(
                o.samples_processed >= o.samples_credited,
                "{name}: {}",
                o.id
            );
            assert!(
                o.finish_s > o.arrival_s && o.start_s >= o.arrival_s,
                "{name}: {o:?}"
            );
            if name != "hadare" {
                assert_eq!(
                    o.samples_processed, o.samples_needed,
                    "{name}: {} without copies",
                    o.id
                );
            }
        }
        assert!(
            r.utilization > 0.0 && r.utilization <= 1.0 + 1e-9,
            "{name}: {}",
            r.utilization
        );
        assert!(
            r.p99_jct_s >= r.avg_jct_s * 0.5 && r.makespan_s >= r.p99_jct_s * 0.5,
            "{name}: {r:?}"
        );
    }
}

#[test]
fn hadare_forks_onto_idle_slots() {
    // One small job on a big cluster: Hadar leaves most slots idle, HadarE
    // puts copies there, and the job finishes sooner for it.
    let t = Trace::parse(
        "t",
        "job id=a workers=1 steps=200000 batch=32 tput=v100:10,p100:8,k80:2",
    )
    .expect("trace");
    let c = cluster();
    let mut hadar = policy::by_name("hadar").expect("known");
    let mut hadare = policy::by_name("hadare").expect("known");
    let a = simulate(&t, &c, hadar.as_mut(), 360.0, 1).expect("hadar");
    let b = simulate(&t, &c, hadare.as_mut(), 360.0, 1).expect("hadare");
    assert!(
        b.utilization > a.utilization,
        "{} vs {}",
        b.utilization,
        a.utilization
    );
    assert!(
        b.avg_jct_s < a.avg_jct_s,
        "{} vs {}",
        b.avg_jct_s,
        a.avg_jct_s
    );
    let o = &b.per_job[0];
    assert_eq!(o.samples_credited, 200_000 * 32);
    assert!(
        o.samples_processed > o.samples_credited,
        "copies cost samples: {o:?}"
    );
}

#[test]
fn a_job_that_fits_nowhere_is_named() {
    let t = Trace::parse(
        "t",
        "job id=a steps=10 tput=v100:1\njob id=big steps=10 tput=k80:0,a100:5\n",
    )
    .expect("trace");
    let mut p = policy::by_name("hadar").expect("known");
    match simulate(&t, &cluster(), p.as_mut(), 360.0, 1) {
        Err(e @ SimError::Refused { .. }) => {
            let m = e.to_string();
            assert!(
                m.starts_with("job big is refused: its throughput is 0 on every device type"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        simulate(&t, &cluster(), p.as_mut(), 0.0, 1),
        Err(SimError::Round(_))
    ));
}

#[test]
fn jobs_arriving_between_boundaries_wait_for_the_next_one() {
    // Nothing at t = 0 and a gap between the jobs: the clock must jump to
    // the boundary after each arrival, not before it.
    let t = Trace::parse(
        "t",
        "job id=a arrival=100 steps=10 tput=v100:1\njob id=b arrival=5000 steps=10 tput=v100:1\n",
    )
    .expect("trace");
    let mut p = policy::by_name("fifo").expect("known");
    let r = simulate(&t, &cluster(), p.as_mut(), 360.0, 1).expect("simulates");
    let starts: Vec<f64> = r.per_job.iter().map(|o| o.start_s).collect();
    assert_eq!(starts, [360.0, 5040.0]);
}
