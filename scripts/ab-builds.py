#!/usr/bin/env python3
"""Two builds of gradwire, one collective, every size, in alternating rounds.

    python3 scripts/ab-builds.py OLD_DIR NEW_DIR [-c COLL] [-t tcp|shm]
        [-p RANKS] [-r ROUNDS] [-b MIN] [-e MAX] [-f FACTOR] [-T SECONDS]
        [--old-env K=V ...] [--new-env K=V ...]

OLD_DIR and NEW_DIR each hold a gwbench (a copy of target/release from an
older commit, say); both run under NEW_DIR's gwrun. Each round runs both,
the old first in odd rounds and the new first in even ones (on this shared
VM the program run second in a round was seen to come out faster), each
timed loop sized to about SECONDS on the slowest rank. Prints, per size,
each build's median time per call (out of place) and old/new as the median
of the per-round ratios with every round's ratio, so that a one-round win
cannot pass for a result (above 1: the new build is faster).

With `-c p2p` (2 ranks) each size has three rows, as `gwbench p2p` prints
them: ping-pong latency in us, one-way and both-ways bandwidth in GB/s;
every ratio is still old time over new time, so above 1 is faster.

`--old-env` and `--new-env` add environment settings to one side only, so
that one build with and without a setting compares the same way (give the
same directory twice).
"""

import argparse
import os
import statistics
import subprocess
import sys


# p2p rows: (name, column of the `gwbench p2p` row, whether it is a rate).
P2P_ROWS = [("latency us", 2, False), ("one way GB/s", 3, True), ("both ways GB/s", 4, True)]


def times(build, gwrun, args, extra):
    """{key: figure} of one gwbench run with the settings `extra` added,
    the key the size (us per call), or (size, row) for p2p; exits naming
    what failed."""
    cmd = [gwrun, "-n", str(args.ranks), os.path.join(build, "gwbench"), args.coll,
           "-b", args.min, "-e", args.max, "-f", str(args.factor),
           "-T", str(args.seconds), "-c", "1"]
    env = dict(os.environ, GW_TRANSPORT=args.transport)
    env.update(extra)
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    out = {}
    for line in run.stdout.splitlines():
        f = line.split()
        if args.coll == "p2p" and len(f) == 6 and f[0] == "[0]" and f[1].isdigit():
            for name, col, _ in P2P_ROWS:
                out[(int(f[1]), name)] = float(f[col])
        elif len(f) > 8 and f[0] == "[0]" and f[1].isdigit():
            out[int(f[1])] = float(f[6])
    if run.returncode != 0 or not out:
        sys.exit(f"ab-builds: {' '.join(cmd)} with {extra} failed (rc {run.returncode}):\n{run.stderr[-2000:]}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("-c", "--coll", default="allreduce")
    p.add_argument("-t", "--transport", choices=["tcp", "shm"], default="tcp")
    p.add_argument("-p", "--ranks", type=int, default=2)
    p.add_argument("-r", "--rounds", type=int, default=4)
    p.add_argument("-b", "--min", default="64K")
    p.add_argument("-e", "--max", default="16M")
    p.add_argument("-f", "--factor", type=int, default=4)
    p.add_argument("-T", "--seconds", type=float, default=0.2)
    p.add_argument("--old-env", action="append", default=[], metavar="K=V")
    p.add_argument("--new-env", action="append", default=[], metavar="K=V")
    args = p.parse_args()
    envs = {}
    for which in ("old", "new"):
        envs[which] = {}
        for kv in getattr(args, f"{which}_env"):
            k, sep, v = kv.partition("=")
            if not sep or not k:
                sys.exit(f"ab-builds: --{which}-env wants KEY=VALUE, got {kv!r}")
            envs[which][k] = v
    gwrun = os.path.join(args.new, "gwrun")
    for d in (args.old, args.new):
        if not os.access(os.path.join(d, "gwbench"), os.X_OK):
            sys.exit(f"ab-builds: no gwbench in {d} (cargo build --release -p gw-bench -p gw-launch)")
    if not os.access(gwrun, os.X_OK):
        sys.exit(f"ab-builds: no gwrun in {args.new}")
    res = {"old": [], "new": []}
    for rnd in range(args.rounds):
        order = ["old", "new"] if rnd % 2 == 0 else ["new", "old"]
        for which in order:
            res[which].append(times(getattr(args, which), gwrun, args, envs[which]))
        print(f"# round {rnd + 1} of {args.rounds}", file=sys.stderr)
    what = "figures" if args.coll == "p2p" else "us per call"
    print(f"{args.coll}, {args.transport}, {args.ranks} ranks: {what} (median over "
          f"{args.rounds} rounds); old/new = median [every round] of per-round time ratios")
    print(f"{'bytes':>10} {'':>15} {'old':>10} {'new':>10}  old/new")
    rate = {name: r for name, _, r in P2P_ROWS}
    for key in sorted(res["old"][0]):
        size, name = key if isinstance(key, tuple) else (key, "")
        old = [r[key] for r in res["old"]]
        new = [r[key] for r in res["new"]]
        # A rate's time ratio is new over old. A figure that gwbench
        # printed as 0 (a rate below its last digit) gives no ratio.
        if 0 in old or 0 in new:
            print(f"{size:>10} {name:>15} {'(printed as 0: too small to compare)':>32}")
            continue
        ratios = [n / o if rate.get(name) else o / n for o, n in zip(old, new)]
        print(f"{size:>10} {name:>15} {statistics.median(old):>10.2f} {statistics.median(new):>10.2f}  "
              f"{statistics.median(ratios):.2f} [{' '.join(f'{x:.2f}' for x in ratios)}]")


if __name__ == "__main__":
    main()
