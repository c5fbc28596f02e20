#!/usr/bin/env python3
"""The performance model's step times for the heterogeneous demo, beside
the demo's measured ones (issue 20's validation of `scripts/hetero-demo.sh`).

    python3 scripts/model-hetero-demo.py [-r ROUNDS] [--warmup W] [--out DIR]

Each round:
1. runs `scripts/hetero-demo.sh` with KEEP_DIR, so both runs' step logs
   (even split, then OptPerf) are kept;
2. calibrates α, β's curve and γ over shared memory (`gwrun -n 2 gwbench
   calibrate`, into a model file of its own);
3. writes a model file for gwtrain's MLP (its layers' parameters in
   backward order, 8-byte gradients, and each rank's training speed as a
   `measured` line: the samples per second of its forward and backward in
   the *even* run after warm-up) and a cluster file of two one-device
   nodes, the fast and the slow rank, joined by the calibrated link, one
   processor each;
4. asks `gwbench model` for the step time of both runs (`--planner even`
   and `--planner optperf`, one bucket: gwtrain all-reduces its whole
   gradient after the backward pass), and compares them with the mean
   measured step times after warm-up.

So the even run's prediction reuses that run's compute speeds (only its
communication and update are predicted), while the OptPerf run's is a true
prediction: the split the model's OptPerf chooses, and its step time, from
speeds measured under another split. The report also prints the local
batches the model's OptPerf chose beside those the job server's chose.

Needs release binaries (the demo builds gwjob and gwtrain; this script
builds gwbench and gwrun).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")
# gwtrain's default network (`--dims 32,128,128,10`), its tensors in
# backward order: (name, parameters).
DIMS = [32, 128, 128, 10]


def layers():
    out = []
    for i in reversed(range(len(DIMS) - 1)):
        out.append((f"l{i}.bias", DIMS[i + 1]))
        out.append((f"l{i}.weight", DIMS[i] * DIMS[i + 1]))
    return out


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def steps(path, warmup):
    with open(path) as f:
        logs = [json.loads(line) for line in f if line.strip()]
    if len(logs) <= warmup:
        sys.exit(f"{path}: {len(logs)} steps, not more than the {warmup} warm-up ones")
    return logs[warmup:]


def speeds(logs):
    """Per rank: samples per second of its compute, over the steps."""
    n = len(logs[0]["local_batches"])
    return [sum(l["local_batches"][r] for l in logs) / sum(l["compute_s"][r] for l in logs)
            for r in range(n)]


def calibrate(out):
    mf = os.path.join(out, "calibration.json")
    env = dict(os.environ, GW_MODEL_FILE=mf, GW_TRANSPORT="shm")
    run([os.path.join(BIN, "gwrun"), "-n", "2", os.path.join(BIN, "gwbench"), "calibrate"], env)
    with open(mf) as f:
        return json.load(f)


def write_files(out, sp, batch, cal):
    params = sum(p for _, p in layers())
    model = os.path.join(out, "gwtrain.model")
    with open(model, "w") as f:
        f.write(f"model name=gwtrain-mlp params={params}\n")
        # 8-byte gradients; SGD keeps no optimizer state.
        f.write(f"train batch_per_device={batch // 2} dataset_samples={batch} grad_bytes=8 "
                "state_bytes_per_param=0\n")
        for r, s in enumerate(sp):
            f.write(f"measured device=rank{r} batch={batch // 2} samples_per_s={s!r}\n")
        for name, p in layers():
            f.write(f"layer name={name} params={p}\n")
    link = cal["shm"]
    pts = cal.get("shm_curve", [])
    curve = (" curve=" + ",".join(f"{b}:{8 / beta / 1e9!r}" for b, beta in pts)) if pts else ""
    line = f"alpha_us={link['alpha'] * 1e6!r} gbit_s={8 / link['beta'] / 1e9!r}{curve}"
    cluster = os.path.join(out, "hetero.cluster")
    with open(cluster, "w") as f:
        f.write("cluster name=hetero-demo\n")
        for r in range(len(sp)):
            f.write(f"device type=rank{r} tflops=1 memory_gib=1 mem_gbytes_s=10 "
                    f"reduce_gbytes_s={1 / cal['gamma'] / 1e9!r}\n")
        # Both ranks are on this machine: whichever level joins them, it
        # is the shared-memory link just calibrated.
        f.write(f"link level=node {line}\nlink level=rack {line}\n")
        for r in range(len(sp)):
            f.write(f"node rack=0 devices=1 type=rank{r} cores=1\n")
    return model, cluster, params * 8


def predict(model, cluster, batch, grad_bytes, planner):
    out = run([os.path.join(BIN, "gwbench"), "model", "--model", model, "--cluster", cluster,
               "--global-batch", str(batch), "--planner", planner,
               "--bucket-bytes", str(grad_bytes), "--json"])
    return json.loads(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--out", default=os.path.join(BIN, "..", "model-hetero-demo"))
    a = p.parse_args()
    if a.rounds < 1:
        p.error("-r must be at least 1")
    os.makedirs(a.out, exist_ok=True)
    run(["cargo", "build", "--release", "-q", "-p", "gw-bench", "-p", "gw-launch"])
    rows = []
    for k in range(a.rounds):
        keep = os.path.join(a.out, f"round{k}")
        env = dict(os.environ, KEEP_DIR=keep, BATCH=str(a.batch), WARMUP=str(a.warmup))
        demo = subprocess.run([os.path.join(ROOT, "scripts", "hetero-demo.sh")], env=env, cwd=ROOT,
                              capture_output=True, text=True)
        with open(os.path.join(a.out, f"round{k}.demo.log"), "w") as f:
            f.write(demo.stdout + demo.stderr)
        # The demo's own criteria may fail on a noisy minute; the logs are
        # still what ran, and the comparison is of those.
        if not os.path.exists(os.path.join(keep, "optperf", "steps.jsonl")):
            sys.exit(f"round {k}: the demo kept no logs (exit {demo.returncode}); see {a.out}")
        even = steps(os.path.join(keep, "even", "steps.jsonl"), a.warmup)
        opt = steps(os.path.join(keep, "optperf", "steps.jsonl"), a.warmup)
        sp = speeds(even)
        cal = calibrate(a.out)
        model, cluster, grad_bytes = write_files(a.out, sp, a.batch, cal)
        row = {"round": k, "speeds": sp}
        for name, logs in [("even", even), ("optperf", opt)]:
            pred = predict(model, cluster, a.batch, grad_bytes, name)
            measured = statistics.mean(l["step_s"] for l in logs)
            batches = statistics.multimode(tuple(l["local_batches"]) for l in logs)[0]
            row[name] = {
                "measured_s": measured,
                "predicted_s": pred["step_time_s"],
                "error": abs(measured - pred["step_time_s"]) / measured,
                "server_batches": list(batches),
                "model_batches": [b["min_batch"] for b in pred["batches"]],
                "exposed_comm_s": pred["exposed_comm_s"],
            }
        rows.append(row)
        print(f"# round {k}: rank speeds {', '.join(f'{s:.0f}' for s in sp)} samples/s; "
              f"even measured {row['even']['measured_s'] * 1e3:.2f} ms predicted "
              f"{row['even']['predicted_s'] * 1e3:.2f} ms; optperf measured "
              f"{row['optperf']['measured_s'] * 1e3:.2f} ms predicted "
              f"{row['optperf']['predicted_s'] * 1e3:.2f} ms", flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'run':>8} {'measured ms':>12} {'predicted ms':>13} {'error':>7}   per round (measured/predicted)")
    for name in ["even", "optperf"]:
        m = statistics.median(r[name]["measured_s"] for r in rows)
        pr = statistics.median(r[name]["predicted_s"] for r in rows)
        err = statistics.median(r[name]["error"] for r in rows)
        per = " ".join(f"{r[name]['measured_s'] / r[name]['predicted_s']:.3f}" for r in rows)
        print(f"{name:>8} {m * 1e3:>12.2f} {pr * 1e3:>13.2f} {err:>7.1%}   {per}")
    last = rows[-1]["optperf"]
    print(f"local batches (last round): job server's OptPerf {last['server_batches']}, "
          f"the model's {last['model_batches']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
