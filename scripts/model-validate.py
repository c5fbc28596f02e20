#!/usr/bin/env python3
"""How well the cost model predicts all-reduce times on this machine.

    python3 scripts/model-validate.py [-r ROUNDS] [-o OUT_DIR] [--bin DIR]

1. `gwrun -n 2 gwbench calibrate` measures α, β and β's curve over size
   (tcp and shm) and γ into a
   fresh model file (GW_MODEL_FILE in OUT_DIR, so ~/.cache is untouched).
2. For each transport and 2, 3 and 4 ranks, writes a one-node cluster file
   with those parameters and this machine's processor count (`cores=`) and asks `gwbench model --allreduce` for its
   prediction; `gwrun -n N gwbench allreduce` then measures the same sizes,
   with rank 0 reading the same model file, and prints the live
   communicator's prediction beside its measurement. The two predictions
   must agree (one source of truth); the script fails if they do not.
3. Calibrates again right after each measurement. That calibration is the
   next measurement's, and it also tells whether the machine held still:
   this shared VM switches between speeds 2-3x apart within minutes, and
   a round whose two calibrations predict times more than 25% apart
   (median over sizes) compared a prediction for one machine with a
   measurement on another. Such rounds are marked `*` and left out of the
   medians (all of them are kept where every round moved).
4. Repeats 2 and 3 ROUNDS times, and prints per transport, ranks and size
   the median over steady rounds of measured/predicted, each round's
   ratio, and the error |measured − predicted| / measured of the median.
5. Writes every round's model files, predictions, measurements and drift
   to OUT_DIR/rounds.json.
Needs release binaries: cargo build --release -p gw-bench -p gw-launch
(or --bin DIR holding gwrun and gwbench, to validate another build).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIN = os.path.join(ROOT, "target", "release")
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-o", "--out", default=os.path.join(ROOT, "target", "model-validate"))
    ap.add_argument("--bin", default=BIN, help="folder with gwrun and gwbench")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, GW_MODEL_FILE=os.path.join(a.out, "model"))
    gwrun, gwbench = os.path.join(a.bin, "gwrun"), os.path.join(a.bin, "gwbench")
    ratios, rounds = {}, []
    model = calibrate(env, gwrun, gwbench)
    for rnd in range(a.rounds):
        for t in ["tcp", "shm"]:
            for n in [2, 3, 4]:
                # Calibrated right before each measurement and right after:
                # the machine's speed drifts by 2-3x over minutes.
                predicted = predict(a, gwbench, model, t, n)
                measured = measure(env, gwrun, gwbench, a, predicted, t, n)
                after = calibrate(env, gwrun, gwbench)
                again = predict(a, gwbench, after, t, n)
                drift = statistics.median(again[s][1] / predicted[s][1] for s in predicted)
                steady = 1 / STEADY <= drift <= STEADY
                print(f"# round {rnd} {t} {n}: predictions moved {drift:.2f}x across the "
                      f"measurement ({'steady' if steady else 'unsteady: left out of the medians'})")
                for s, (algo, p) in predicted.items():
                    ratios.setdefault((t, n, s), []).append((algo, p, measured[str(s)], steady))
                rounds.append({"round": rnd, "transport": t, "ranks": n,
                               "model": model, "model_after": after,
                               "drift": drift, "steady": steady,
                               "predicted_us": {str(s): p for s, (_, p) in predicted.items()},
                               "measured_us": measured})
                with open(os.path.join(a.out, "rounds.json"), "w") as f:
                    json.dump(rounds, f)
                model = after
    report(ratios)


# How far two calibrations around one measurement may disagree (median
# ratio of their predictions) for the round to count.
STEADY = 1.25


def calibrate(env, gwrun, gwbench):
    """A fresh calibration (`gwrun -n 2 gwbench calibrate`): the model file."""
    print(run([gwrun, "-n", "2", gwbench, "calibrate"], env).strip())
    m = json.load(open(env["GW_MODEL_FILE"]))
    print(f"# model file {json.dumps(m)}")
    return m


def predict(a, gwbench, m, t, n):
    """gwbench model's predictions for transport t on n ranks from model
    file m: a one-node cluster with the calibrated link, its curve, γ and
    this machine's processor count."""
    link = m[t]
    pts = m.get(f"{t}_curve", [])
    curve = (" curve=" + ",".join(f"{b}:{8 / beta / 1e9!r}" for b, beta in pts)) if pts else ""
    path = os.path.join(a.out, f"cluster-{t}-{n}")
    with open(path, "w") as f:
        f.write(f"cluster name=this-vm-{t}-{n}\n"
                f"device type=cpu tflops=1 memory_gib=1 mem_gbytes_s=10 reduce_gbytes_s={1 / m['gamma'] / 1e9!r}\n"
                f"link level=node alpha_us={link['alpha'] * 1e6!r} gbit_s={8 / link['beta'] / 1e9!r}{curve}\n"
                f"racks count=1 nodes=1 devices={n} type=cpu cores={os.cpu_count()}\n")
    sizes = ",".join(str(s) for s in SIZES)
    rows = json.loads(run([gwbench, "model", "--cluster", path, "--allreduce", sizes, "--json"]))["allreduce"]
    return {r["bytes"]: (r["algo"], r["time_s"] * 1e6) for r in rows}


def measure(env, gwrun, gwbench, a, predicted, t, n):
    """gwbench allreduce on one configuration, out of place, microseconds by
    size; checks that the live communicator (reading the model file that
    `predicted` came from) predicted exactly what gwbench model did."""
    j = os.path.join(a.out, f"run-{t}-{n}.json")
    # Loops sized by time (at least 5 calls), as calibration sizes its own.
    run([gwrun, "-n", str(n), gwbench, "allreduce", "-b", "64K", "-e", "64M", "-f", "4",
         "-T", "0.2", "-n", "5", "-w", "5", "-c", "0", "-J", j], dict(env, GW_TRANSPORT=t))
    rows = json.load(open(j))["rows"]
    for r in rows:
        algo, p = predicted[r["size"]]
        live = r.get("predicted_us")
        if r.get("algorithm") != algo or live is None or abs(live - p) > 1e-6 * p:
            sys.exit(f"{t} {n} ranks {r['size']} B: gwbench model says {algo} {p} us, "
                     f"the live communicator {r.get('algorithm')} {live} us")
    return {str(r["size"]): r["out_of_place"]["time_us"] for r in rows}


def report(ratios):
    print(f"{'transport':>9} {'ranks':>5} {'bytes':>9} {'algo':>5} {'predicted us':>12} {'measured us':>12} "
          f"{'meas/pred':>9} {'error':>6}   per-round meas/pred")
    errors = {}
    for key in sorted(ratios):
        t, n, s = key
        every = ratios[key]
        rs = [r for r in every if r[3]] or every
        med = statistics.median(m / p for _, p, m, _ in rs)
        err = abs(med - 1) / med
        errors.setdefault((t, n), []).append(err)
        per = " ".join(f"{m / p:.2f}{'' if ok else '*'}" for _, p, m, ok in every)
        pm = statistics.median(p for _, p, _, _ in rs)
        mm = statistics.median(m for _, _, m, _ in rs)
        print(f"{t:>9} {n:>5} {s:>9} {rs[0][0]:>5} {pm:>12.1f} {mm:>12.1f} {med:>9.2f} {100 * err:>5.0f}%   {per}")
    print("# *: a round whose calibrations before and after the measurement "
          f"predicted more than {STEADY}x apart, left out of the medians")
    print("# median error per transport and ranks (64 KiB to 64 MiB):")
    for (t, n), e in sorted(errors.items()):
        print(f"#   {t} {n} ranks: {100 * statistics.median(e):.0f}% (worst {100 * max(e):.0f}%)")


if __name__ == "__main__":
    main()
