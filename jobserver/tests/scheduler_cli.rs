//! `gwjob simulate` and `gwjob gen-trace` as a user runs them: the real
//! binary on the shipped trace and cluster files and on broken ones,
//! checking what it prints and its exit status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GWJOB: &str = env!("CARGO_BIN_EXE_gwjob");

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces")
}

fn gwjob(args: &[&str]) -> Output {
    Command::new(GWJOB).args(args).output().expect("run gwjob")
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A directory of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("gw-sched-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a scratch directory");
        Scratch(p)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write a scratch file");
        p.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn simulate(trace: &str, cluster: &str, policy: &str, extra: &[&str]) -> Output {
    let mut a = vec![
        "simulate",
        "--trace",
        trace,
        "--cluster",
        cluster,
        "--policy",
        policy,
    ];
    a.extend_from_slice(extra);
    gwjob(&a)
}

#[test]
fn every_policy_simulates_the_shipped_files_the_same_way_twice() {
    let trace = traces().join("small-12.trace").display().to_string();
    let cluster = traces().join("cluster-small.cluster").display().to_string();
    for policy in ["fifo", "gavel", "gavel-makespan", "hadar", "hadare"] {
        let a = simulate(
            &trace,
            &cluster,
            policy,
            &["--json", "--seed", "4", "--round", "300"],
        );
        assert!(a.status.success(), "{policy}: {}", err(&a));
        let v: serde_json::Value = serde_json::from_str(&out(&a)).expect("one JSON object");
        assert_eq!(v["policy"], policy);
        assert_eq!(v["jobs"], 12);
        assert_eq!(v["seed"], 4);
        assert_eq!(v["round_s"], 300.0);
        for key in gw_scheduler::report::METRIC_KEYS {
            let x = v[key].as_f64().unwrap_or(-1.0);
            assert!(x > 0.0, "{policy}: {key} = {}", v[key]);
        }
        let b = simulate(
            &trace,
            &cluster,
            policy,
            &["--json", "--seed", "4", "--round", "300"],
        );
        assert_eq!(out(&a), out(&b), "{policy}: same seed, same bytes");
    }
    let table = simulate(&trace, &cluster, "hadar", &[]);
    assert!(table.status.success(), "{}", err(&table));
    for row in [
        "average JCT",
        "p99 JCT",
        "makespan",
        "average queueing",
        "utilisation",
        "finish-time fairness",
    ] {
        assert!(out(&table).contains(row), "{row} missing: {}", out(&table));
    }
}

/// `gwjob gen-trace --jobs 30 --seed SEED --arrival-rate 12` plus `extra`.
fn gen_trace(seed: &str, extra: &[&str]) -> Output {
    let mut a = vec![
        "gen-trace",
        "--jobs",
        "30",
        "--seed",
        seed,
        "--arrival-rate",
        "12",
    ];
    a.extend_from_slice(extra);
    gwjob(&a)
}

#[test]
fn gen_trace_is_reproducible_and_simulates() {
    let dir = Scratch::new("gen");
    let a = gen_trace("9", &[]);
    assert!(a.status.success(), "{}", err(&a));
    assert_eq!(out(&a).lines().count(), 30);
    assert_eq!(out(&a), out(&gen_trace("9", &[])));
    assert_ne!(out(&a), out(&gen_trace("10", &[])));
    let path = dir.0.join("t.trace").display().to_string();
    let w = gen_trace("9", &["--out", &path]);
    assert!(w.status.success(), "{}", err(&w));
    assert_eq!(
        std::fs::read_to_string(&path).expect("the trace was written"),
        out(&a)
    );
    let cluster = traces().join("cluster-small.cluster").display().to_string();
    let s = simulate(&path, &cluster, "gavel", &["--json"]);
    assert!(s.status.success(), "{}", err(&s));
}

#[test]
fn mistakes_are_named_with_the_right_exit_status() {
    let dir = Scratch::new("bad");
    let cluster = traces().join("cluster-small.cluster").display().to_string();
    let trace = traces().join("small-12.trace").display().to_string();
    let bad_trace = dir.file(
        "bad.trace",
        "job id=a steps=10 tput=v100:1\n\njob id=b steps=x tput=v100:1\n",
    );
    let bad_cluster = dir.file(
        "bad.cluster",
        "nodes type=v100 count=2\nnodes type=k80 count=2 slots=four\n",
    );
    let nowhere = dir.file(
        "nowhere.trace",
        "job id=a steps=10 tput=v100:1\njob id=tpu-only steps=10 tput=tpu:5,k80:0\n",
    );
    for (o, code, want) in [
        (
            simulate(&bad_trace, &cluster, "fifo", &[]),
            1,
            "bad.trace line 3, field `steps`: \"x\" is not a whole number",
        ),
        (
            simulate(&trace, &bad_cluster, "fifo", &[]),
            1,
            "bad.cluster line 2, field `slots`",
        ),
        (
            simulate(&nowhere, &cluster, "hadar", &[]),
            1,
            "job tpu-only is refused: its throughput is 0 on every device type the cluster has (v100, p100, k80)",
        ),
        (
            simulate(&trace, &cluster, "srtf", &[]),
            2,
            "--policy must be fifo, gavel, gavel-makespan, hadar or hadare, not \"srtf\"",
        ),
        (
            simulate(&trace, &cluster, "hadar", &["--round", "0"]),
            2,
            "--round must be a positive number",
        ),
        (
            simulate("/nonexistent/t", &cluster, "fifo", &[]),
            1,
            "cannot read /nonexistent/t",
        ),
        (
            gwjob(&["gen-trace", "--jobs", "0", "--seed", "1"]),
            2,
            "--jobs must be between 1",
        ),
        (gwjob(&["gen-trace", "--jobs", "3"]), 2, "--seed"),
        (
            gwjob(&[
                "gen-trace",
                "--jobs",
                "3",
                "--seed",
                "1",
                "--arrival-rate",
                "-1",
            ]),
            2,
            "--arrival-rate must be a positive",
        ),
    ] {
        assert_eq!(o.status.code(), Some(code), "{want}: {}", err(&o));
        assert!(err(&o).contains(want), "wanted {want:?} in {:?}", err(&o));
        assert_eq!(err(&o).lines().count(), 1, "one line: {}", err(&o));
        assert!(out(&o).is_empty(), "{}", out(&o));
    }
}
