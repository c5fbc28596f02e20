#!/usr/bin/env python3
"""Plots busbw against size for gradwire and its peers, one panel per configuration.

    python3 scripts/plot-performance.py [OUT_DIR] [-o PNG]

OUT_DIR is the output directory of scripts/compare-peers.sh (default
$CARGO_TARGET_DIR/compare-peers, else target/compare-peers); its results.json
holds the medians. The PNG (default OUT_DIR/busbw.png) has log-scaled axes and
shows each configuration's ceiling as busbw as a dashed line. Needs matplotlib
(pip install matplotlib); compare-peers.sh installs it into its Python venv.
"""

import argparse
import json
import os
import sys

SYSTEMS = [  # name in results.json, label, style
    ("gradwire", "gradwire", {"color": "tab:red", "marker": "o", "linewidth": 2.2}),
    ("openmpi", "OpenMPI", {"color": "tab:blue", "marker": "s", "linewidth": 1.4}),
    ("gloo", "Gloo", {"color": "tab:green", "marker": "^", "linewidth": 1.4}),
]
TITLES = {
    "tcp2": "TCP loopback, 2 ranks",
    "shm2": "shared memory, 2 ranks",
    "tcp4": "TCP loopback, 4 ranks (2 cores)",
    "shm4": "shared memory, 4 ranks (2 cores)",
}


def size_label(b):
    if b >= 1 << 20:
        return f"{b >> 20}M"
    if b >= 1 << 10:
        return f"{b >> 10}K"
    return f"{b}"


def main():
    default_dir = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "compare-peers")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default=default_dir, help="compare-peers.sh output directory")
    ap.add_argument("-o", "--output", help="PNG to write (default OUT_DIR/busbw.png)")
    ap.add_argument("--dpi", type=int, default=80)
    args = ap.parse_args()
    path = os.path.join(args.out_dir, "results.json")
    try:
        with open(path) as f:
            results = json.load(f)
    except OSError as e:
        sys.exit(f"plot-performance: cannot read {path} ({e.strerror}); run scripts/compare-peers.sh first")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit(f"plot-performance: matplotlib is missing for {sys.executable}: pip install matplotlib")

    configs = [c for c in TITLES if c in results.get("configs", {})]
    if not configs:
        sys.exit(f"plot-performance: {path} has no configuration to plot")
    cols = 2 if len(configs) > 1 else 1
    rows = (len(configs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    meta = results.get("meta", {})
    for ax, cfg in zip(axes.flat, configs):
        c = results["configs"][cfg]
        sizes = sorted(int(s) for s in c["sizes"])
        for key, label, style in SYSTEMS:
            pts = [
                (b, c["sizes"][str(b)][key]["busbw"])
                for b in sizes
                if key in c["sizes"][str(b)] and c["sizes"][str(b)][key].get("busbw")
            ]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label, markersize=4, **style)
        if c.get("ceiling_busbw"):
            what = "memcpy" if c["transport"] == "shm" else "TCP both ways / n"
            ax.axhline(c["ceiling_busbw"], color="gray", linestyle="--", linewidth=1, label=f"ceiling ({what})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(b) for b in sizes], fontsize=8)
        ax.minorticks_off()
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(TITLES[cfg], fontsize=10)
        ax.set_xlabel("size (bytes)", fontsize=8)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(configs):]:
        ax.set_visible(False)
    sub = "float32 sum all-reduce, busbw = algbw·2(n−1)/n, medians"
    if meta.get("commit"):
        sub += f"; gradwire {meta['commit']}"
    fig.suptitle(sub, fontsize=9)
    fig.tight_layout()
    png = args.output or os.path.join(args.out_dir, "busbw.png")
    fig.savefig(png, dpi=args.dpi)
    print(f"plot-performance: wrote {png}")


if __name__ == "__main__":
    main()
