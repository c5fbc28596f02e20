#!/usr/bin/env python3
"""Plots busbw against size for every collective of scripts/compare-collectives.py,
gradwire beside each peer, one figure per collective with a panel per
configuration (transport and ranks).

    python3 scripts/plot-collectives.py RESULTS.json [RESULTS.json ...] [-o DIR]

Each RESULTS.json is one run's `results.<transport><ranks>.json` (in the
script's --out directory); its medians over rounds are plotted, log-scaled,
with the run's settings in the panel title. Writes DIR/<collective>.png
(default DIR: docs/collectives). Needs matplotlib (pip install matplotlib).
"""

import argparse
import json
import os
import sys

STYLE = {  # system -> (label, matplotlib style)
    "gradwire": ("gradwire", {"color": "tab:red", "marker": "o", "linewidth": 2.2}),
    "openmpi": ("OpenMPI", {"color": "tab:blue", "marker": "s", "linewidth": 1.4}),
    "openmpi-ucx": ("OpenMPI (UCX)", {"color": "tab:cyan", "marker": "v", "linewidth": 1.4}),
    "mpich": ("MPICH", {"color": "tab:purple", "marker": "D", "linewidth": 1.4}),
    "gloo": ("Gloo (torch)", {"color": "tab:green", "marker": "^", "linewidth": 1.4}),
}


def load(paths):
    runs = []
    for p in paths:
        try:
            with open(p) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"plot-collectives: {p}: {e}")
        for key in ("transport", "ranks", "rounds", "collectives"):
            if key not in doc:
                sys.exit(f"plot-collectives: {p}: no {key!r} (not a compare-collectives results file)")
        runs.append(doc)
    runs.sort(key=lambda d: (d["ranks"], d["transport"]))
    return runs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+")
    p.add_argument("-o", "--out", default=os.path.join("docs", "collectives"))
    a = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot-collectives: needs matplotlib (pip install matplotlib)")
    runs = load(a.results)
    order = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]
    colls = sorted({c for r in runs for c in r["collectives"]},
                   key=lambda c: order.index(c) if c in order else len(order))
    os.makedirs(a.out, exist_ok=True)
    for coll in colls:
        have = [r for r in runs if coll in r["collectives"]]
        fig, axes = plt.subplots(1, len(have), figsize=(4.2 * len(have), 3.6), squeeze=False)
        for ax, run in zip(axes[0], have):
            rows = run["collectives"][coll]
            sizes = sorted(int(s) for s in rows)
            for who, (label, style) in STYLE.items():
                pts = [(s, rows[str(s)][who]) for s in sizes if who in rows[str(s)]]
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], label=label, **style)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("size (bytes)")
            ax.set_title(f"{run['transport']}, {run['ranks']} ranks ({run['rounds']} rounds)",
                         fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel("busbw (GB/s, median)")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{coll}: gradwire and its peers (scripts/compare-collectives.py)", fontsize=11)
        fig.tight_layout()
        path = os.path.join(a.out, f"{coll}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
