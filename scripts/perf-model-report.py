#!/usr/bin/env python3
"""Regenerates the figures of docs/performance-model.md from `gwbench model`.

    cargo build --release -p gw-bench && python3 scripts/perf-model-report.py

Writes the scaling table (8 to 8,192 devices on the reference cluster's
shape: 8 GPUs per node, 16 nodes per rack, the 2:1 spine) between the
GENERATED markers of docs/performance-model.md, the comparison with
published figures, the time the 10,000-device simulation takes, and
docs/performance-model-scaling.svg (drawn here, no plotting library).
Deterministic: the same build gives the same files.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GWBENCH = os.environ.get("GWBENCH", os.path.join(ROOT, "target", "release", "gwbench"))
DATA = os.path.join(ROOT, "perfmodel", "data")
DOC = os.path.join(ROOT, "docs", "performance-model.md")
SVG = os.path.join(ROOT, "docs", "performance-model-scaling.svg")
SIZES = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
MODELS = [("resnet50", "ResNet-50"), ("gpt2-small", "GPT-2 small")]


def model(args):
    out = subprocess.run([GWBENCH, "model", *args, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"gwbench model {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def sized_cluster(tmp, base, devices, per_node=8, per_rack=16):
    """The base cluster file with its racks line replaced by `devices` devices."""
    text = open(os.path.join(DATA, base)).read()
    nodes = devices // per_node
    racks, in_rack = (1, nodes) if nodes <= per_rack else (nodes // per_rack, per_rack)
    dev = re.search(r"^racks .*type=(\S+)", text, re.M).group(1)
    text = re.sub(r"^racks .*$", f"racks count={racks} nodes={in_rack} devices={per_node} type={dev}", text, flags=re.M)
    path = os.path.join(tmp, f"{base}-{devices}")
    with open(path, "w") as f:
        f.write(text)
    return path


def scaling(tmp):
    rows = {}
    for name, _ in MODELS:
        for n in SIZES:
            rows[(name, n)] = model(["--model", name, "--cluster", sized_cluster(tmp, "cluster-reference.cluster", n)])
    return rows


def table(rows):
    out = ["| devices | " + " | ".join(f"{label} step (ms) | exposed comm (ms) | samples/s | efficiency | bottleneck" for _, label in MODELS) + " |",
           "|---:|" + "---:|---:|---:|---:|---|" * len(MODELS)]
    for n in SIZES:
        cells = []
        for name, _ in MODELS:
            p = rows[(name, n)]
            cells += [f"{p['step_time_s'] * 1e3:.2f}", f"{p['exposed_comm_s'] * 1e3:.2f}", f"{p['samples_per_s']:,.0f}",
                      f"{100 * p['scaling_efficiency']:.1f}%", p["bottleneck"]]
        out.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def published(tmp):
    lines = ["| case | published | model |", "|---|---:|---:|"]
    # Goyal et al. 2017: ResNet-50, 32 images per GPU, 8 -> 256 P100s.
    one = model(["--model", "resnet50", "--cluster", sized_cluster(tmp, "cluster-goyal.cluster", 8, 8, 32)])
    many = model(["--model", "resnet50", "--cluster", "goyal"])
    eff = many["samples_per_s"] / (32 * one["samples_per_s"])
    lines.append(f"| Goyal et al. 2017, ResNet-50 on 256 P100 (32 x 8, 50 Gb/s Ethernet), efficiency against 8 GPUs | ~90% | {100 * eff:.1f}% |")
    # nccl-tests issue #149: 8 A100-80GB over NVLink, large all-reduce busbw.
    with open(os.path.join(tmp, "dgx"), "w") as f:
        f.write(open(os.path.join(DATA, "cluster-reference.cluster")).read().replace("racks count=64 nodes=16", "racks count=1 nodes=1"))
    ar = model(["--cluster", os.path.join(tmp, "dgx"), "--allreduce", "1G"])["allreduce"][0]
    lines.append(f"| nccl-tests #149: all-reduce busbw, 8 A100 (NVLink), 1 GiB | ~200 GB/s | {ar['busbw_gbs']:.0f} GB/s |")
    # nccl-tests issue #119: 3 servers x 8 A100-40GB, 4 HDR NICs each.
    with open(os.path.join(tmp, "hdr4"), "w") as f:
        t = open(os.path.join(DATA, "cluster-reference.cluster")).read()
        t = t.replace("gbit_s=200 nics=8\n", "gbit_s=200 nics=4\n", 1).replace("racks count=64 nodes=16", "racks count=1 nodes=3")
        f.write(t)
    ar = model(["--cluster", os.path.join(tmp, "hdr4"), "--allreduce", "128M"])["allreduce"][0]
    lines.append(f"| nccl-tests #119: all-reduce busbw, 3 x 8 A100 with 4 x 200 Gb/s HDR each, 128 MiB | 85-96 GB/s | {ar['busbw_gbs']:.0f} GB/s ({ar['algo']}) |")
    return "\n".join(lines)


def ten_k():
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        p = model(["--model", "gpt2-small", "--cluster", "10k"])
        best = min(best, time.perf_counter() - t0)
    return p, best


def svg(rows):
    w, h, left, right, top, bottom = 640, 380, 60, 20, 30, 50
    xs = [i for i in range(len(SIZES))]
    def x(i):
        return left + (w - left - right) * i / (len(SIZES) - 1)
    def y(e):
        return top + (h - top - bottom) * (1 - e)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="18" text-anchor="middle">Predicted scaling efficiency, reference cluster (A100, 8/node, 200 Gb/s/GPU, 2:1 spine)</text>']
    for e in [0, 0.25, 0.5, 0.75, 1.0]:
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y(e):.1f}" y2="{y(e):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(e) + 4:.1f}" text-anchor="end">{int(e * 100)}%</text>')
    for i in xs:
        parts.append(f'<text x="{x(i):.1f}" y="{h - bottom + 18}" text-anchor="middle">{SIZES[i]}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">devices</text>')
    for (name, label), colour in zip(MODELS, ["#c0392b", "#2471a3"]):
        pts = " ".join(f"{x(i):.1f},{y(rows[(name, n)]['scaling_efficiency']):.1f}" for i, n in enumerate(SIZES))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for i, n in enumerate(SIZES):
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(rows[(name, n)]["scaling_efficiency"]):.1f}" r="3" fill="{colour}"/>')
        k = MODELS.index((name, label))
        parts.append(f'<rect x="{left + 10}" y="{top + 10 + 18 * k}" width="12" height="3" fill="{colour}"/>')
        parts.append(f'<text x="{left + 28}" y="{top + 15 + 18 * k}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    if not os.path.exists(GWBENCH):
        sys.exit(f"{GWBENCH} not found: cargo build --release -p gw-bench first")
    with tempfile.TemporaryDirectory() as tmp:
        rows = scaling(tmp)
        pub = published(tmp)
    p10k, secs = ten_k()
    block = "\n".join([
        "<!-- GENERATED by scripts/perf-model-report.py: do not edit by hand -->",
        "### Predicted scaling on the reference cluster",
        "",
        table(rows),
        "",
        "![predicted scaling efficiency](performance-model-scaling.svg)",
        "",
        "### Beside published figures",
        "",
        pub,
        "",
        "### The 10,000-device simulation",
        "",
        f"`gwbench model --model gpt2-small --cluster 10k`: {p10k['devices']:,} devices in 100 racks, "
        f"step {p10k['step_time_s'] * 1e3:.1f} ms ({p10k['exposed_comm_s'] * 1e3:.1f} ms exposed communication), "
        f"{p10k['samples_per_s']:,.0f} samples/s, efficiency {100 * p10k['scaling_efficiency']:.1f}%, "
        f"{p10k['bottleneck']}-bound; ${p10k['cost_per_epoch']:,.2f} per epoch. "
        f"The whole run (process start, parsing, planning, simulation) took {secs * 1e3:.0f} ms at best of 3 "
        "on the 2-core development VM.",
        "<!-- END GENERATED -->",
    ])
    doc = open(DOC).read()
    doc = re.sub(r"<!-- GENERATED.*?<!-- END GENERATED -->", lambda _: block, doc, flags=re.S)
    with open(DOC, "w") as f:
        f.write(doc)
    with open(SVG, "w") as f:
        f.write(svg(rows))
    print(block)


if __name__ == "__main__":
    main()
