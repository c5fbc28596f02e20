//! `gwbench model` as a user runs it: a real process, real files.

use std::path::PathBuf;
use std::process::Command;

fn gwbench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gwbench"))
        .args(args)
        .output()
        .expect("gwbench starts");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gw-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn json_has_the_promised_fields_and_is_the_same_every_run() {
    let args = ["model", "--model", "resnet50", "--cluster", "10k", "--json"];
    let (code, a, err) = gwbench(&args);
    assert_eq!(code, 0, "{err}");
    let (_, b, _) = gwbench(&args);
    assert_eq!(a, b, "two runs differ");
    let v: serde_json::Value = serde_json::from_str(&a).expect("one JSON object");
    for key in [
        "step_time_s",
        "exposed_comm_s",
        "samples_per_s",
        "scaling_efficiency",
        "cost_per_epoch",
    ] {
        let x = v[key].as_f64().unwrap_or(f64::NAN);
        assert!(x.is_finite() && x >= 0.0, "{key}: {}", v[key]);
    }
    assert!(
        ["io", "h2d", "compute", "update", "communication"]
            .contains(&v["bottleneck"].as_str().unwrap_or(""))
    );
    assert_eq!(v["devices"], 10_000);
}

#[test]
fn the_table_names_every_part_of_the_step() {
    let (code, out, err) = gwbench(&[
        "model",
        "--model",
        "bert-base",
        "--cluster",
        "reference",
        "--planner",
        "even",
        "--algo",
        "ring",
    ]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "step time",
        "io (exposed)",
        "host to device",
        "forward",
        "backward",
        "update",
        "comm (exposed)",
        "bottleneck",
        "samples/s",
        "scaling efficiency",
        "cost per epoch",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    assert!(out.contains(":ring"), "{out}");
}

#[test]
fn bad_files_are_named_by_line_and_field() {
    let m = scratch(
        "bad.model",
        "model name=x\ntrain dataset_samples=10\nlayer name=a params=ten\n",
    );
    let (code, _, err) = gwbench(&[
        "model",
        "--model",
        m.to_str().expect("utf-8"),
        "--cluster",
        "reference",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("bad.model line 3, field `params`: \"ten\" is not a whole number"),
        "{err}"
    );
    let c = scratch(
        "bad.cluster",
        "cluster name=y\ndevice type=a tflops=1 memory_gib=8 mem_gbytes_s=100\nracks nodes=2 devices=1 type=b\n",
    );
    let (code, _, err) = gwbench(&[
        "model",
        "--model",
        "resnet50",
        "--cluster",
        c.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains(
            "bad.cluster line 3, field `type`: device type \"b\" has no `device` line above"
        ),
        "{err}"
    );
    let (code, _, err) = gwbench(&["model", "--model", "nosuch", "--cluster", "reference"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no shipped .model of that name (resnet50"),
        "{err}"
    );
    let (code, _, err) = gwbench(&["model", "--cluster", "reference"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn a_model_the_memory_cannot_hold_is_reported_as_such() {
    let (code, out, err) = gwbench(&["model", "--model", "gpt2-small", "--cluster", "goyal"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("does not fit in the cluster's memory: at most 1792 samples"),
        "{err}"
    );
}

#[test]
fn allreduce_predictions_use_nccl_tests_bandwidths() {
    let (code, out, err) = gwbench(&[
        "model",
        "--cluster",
        "goyal",
        "--allreduce",
        "1M,64M",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["ranks"], 256);
    for row in v["allreduce"].as_array().expect("rows") {
        let (s, t) = (
            row["bytes"].as_f64().unwrap_or(0.0),
            row["time_s"].as_f64().unwrap_or(0.0),
        );
        let algbw = row["algbw_gbs"].as_f64().unwrap_or(0.0);
        assert!((algbw - s / t / 1e9).abs() < 1e-9 * algbw);
        let busbw = row["busbw_gbs"].as_f64().unwrap_or(0.0);
        assert!((busbw - algbw * 2.0 * 255.0 / 256.0).abs() < 1e-9 * busbw);
    }
}
