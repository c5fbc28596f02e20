#!/usr/bin/env python3
"""Every collective of gradwire, and its point-to-point, against OpenMPI, MPICH and Gloo, in the same run.

    python3 scripts/compare-collectives.py [-t shm|tcp] [-p RANKS] [-r ROUNDS]
        [-T SECONDS] [-c COLL,COLL,...] [-b MIN] [-e MAX] [-f FACTOR]
        [--peers openmpi,openmpi-ucx,mpich,gloo] [--out DIR]

Each round runs, for each collective and peer in turn (interleaved, so the
machine's speed of the moment is shared; gradwire first in odd rounds and
last in even ones, since on this VM the program run later in a round was
seen to come out faster): `gwrun -n RANKS gwbench COLL -T SECONDS`,
`mpirun -n RANKS bench/peers/mpi_coll COLL -T SECONDS` and `python3
bench/peers/gloo_coll.py -n RANKS COLL -T SECONDS` (PyTorch's Gloo
backend), all float32 sum (root 0), out of place (Gloo's all-reduce,
broadcast and reduce in place, as torch.distributed has them), each timed
loop sized to about SECONDS on the slowest rank, every result checked.
The broadcast is compared in place on every side: MPI_Bcast has one
buffer, as torch's broadcast has, while gradwire's out-of-place broadcast
(nccl-tests' first column) also copies the root's input to its output, a
pass over the message that no peer makes; gwbench's JSON files in --out
keep both of its columns.
`-c p2p` (in the default list; 2 ranks only) runs `gwbench p2p -T SECONDS`
against `bench/peers/mpi_p2p` under each MPI (Gloo has no point-to-point
program here): ping-pong latency, one-way and bidirectional bandwidth,
each loop sized by time, sends in windows of 64; reported as p2p_lat
(peer/gradwire, so above 1 is gradwire faster), p2p_bw and p2p_bibw.
Transports: shm is gradwire's shared memory against OpenMPI's ob1 with its
shared-memory BTL and MPICH's default (ch4 with UCX, which uses shared
memory between local ranks); tcp is gradwire's TCP over loopback against
OpenMPI's ob1 with btl tcp,self on lo and MPICH with MPIR_CVAR_NOLOCAL=1
and UCX_TLS=tcp,self. `openmpi-ucx` is OpenMPI over its UCX PML instead of
ob1 (`--mca pml ucx`, with `pml_ucx_tls` and `pml_ucx_devices` set to any,
without which OpenMPI 4.1 refuses UCX on a host with no InfiniBand or
RoCE device): UCX_TLS=sm,self for shm (its shared memory and CMA
single-copy), UCX_TLS=tcp,self with UCX_NET_DEVICES=lo for tcp. Gloo runs
over TCP on loopback either way (it has no shared-memory transport for CPU
tensors).

Prints, per collective, busbw (GB/s, nccl-tests' definitions, medians over
rounds) of gradwire and each peer, and gradwire/peer as the median of the
per-round ratios with their range; a size from 64 KiB up where the median
is below 1.0 is marked "behind" (issue 21's first target). Raw outputs and
results.json go to --out (default target/compare-collectives).

Needs OpenMPI's mpicc.openmpi/mpirun.openmpi and MPICH's
mpicc.mpich/mpirun.mpich (Debian: openmpi-bin libopenmpi-dev mpich
libmpich-dev), torch for Gloo (a missing one is skipped with a line saying
so) and gradwire's release build (cargo build --release --bins).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COLLS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "p2p"]
# What a p2p run reports, each compared as a collective's busbw is; latency
# is the one where lower is better.
P2P_METRICS = {"p2p_lat": "latency_us", "p2p_bw": "bw", "p2p_bibw": "bibw"}
BEHIND_FROM = 64 << 10
PEERS = ["openmpi", "openmpi-ucx", "mpich", "gloo"]


def size_arg(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{s!r} is not a size (bytes, or with K/M/G)") from None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-t", "--transport", choices=["shm", "tcp"], default="shm")
    p.add_argument("-p", "--ranks", type=int, default=2)
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("-T", "--seconds", type=float, default=0.3)
    p.add_argument("-c", "--colls", default=",".join(COLLS))
    p.add_argument("-b", "--min", type=size_arg, default=64 << 10)
    p.add_argument("-e", "--max", type=size_arg, default=64 << 20)
    p.add_argument("-f", "--factor", type=int, default=16)
    p.add_argument("--peers", default="openmpi,openmpi-ucx,mpich,gloo")
    p.add_argument("--out", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"),
                                                  "compare-collectives"))
    a = p.parse_args()
    a.colls = a.colls.split(",")
    bad = [c for c in a.colls if c not in COLLS]
    if bad:
        p.error(f"unknown collective(s) {', '.join(bad)} (from {', '.join(COLLS)})")
    a.peers = [x for x in a.peers.split(",") if x]
    if any(x not in PEERS for x in a.peers):
        p.error(f"--peers takes {', '.join(PEERS)} (any of them, comma-separated)")
    if a.ranks < 2 or a.rounds < 1 or not 0 < a.seconds <= 60 or a.factor < 2 or a.min > a.max:
        p.error("need -p >= 2, -r >= 1, 0 < -T <= 60, -f >= 2 and -b <= -e")
    return a


def sizes(a):
    s, out = a.min, []
    while s <= a.max:
        out.append(s)
        s *= a.factor
    return out


def build_peers(a, out):
    """Peer name -> (mpirun argv prefix, extra env); skipped ones are said."""
    peers = {}
    ompi_info = []  # OpenMPI's component list, read once when a peer needs it

    def has_component(line):
        if not ompi_info:
            ompi_info.append(subprocess.run(["ompi_info"], capture_output=True, text=True).stdout)
        return line in ompi_info[0]

    src = os.path.join(REPO, "bench", "peers", "mpi_coll.c")
    for name in a.peers:
        if name == "gloo":
            r = subprocess.run([sys.executable, "-c", "import torch.distributed as d; "
                                "assert d.is_available() and d.is_gloo_available()"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"# skipped gloo: torch with Gloo does not import ({r.stderr.strip()[-200:]})")
                continue
            gloo = os.path.join(REPO, "bench", "peers", "gloo_coll.py")
            peers[name] = ([sys.executable, gloo, "-n", str(a.ranks)], {})
            continue
        mpi = "mpich" if name == "mpich" else "openmpi"
        cc, run = f"mpicc.{mpi}", f"mpirun.{mpi}"
        if not (shutil.which(cc) and shutil.which(run)):
            print(f"# skipped {name}: {cc} or {run} not found (Debian: "
                  f"{'openmpi-bin libopenmpi-dev' if mpi == 'openmpi' else 'mpich libmpich-dev'})")
            continue
        if name == "openmpi-ucx":
            if not has_component("MCA pml: ucx"):
                print("# skipped openmpi-ucx: this OpenMPI has no UCX PML (ompi_info)")
                continue
        exe = os.path.join(out, f"mpi_coll.{name}")
        p2p_exe = os.path.join(out, f"mpi_p2p.{name}")
        p2p_src = os.path.join(REPO, "bench", "peers", "mpi_p2p.c")
        r = subprocess.run([cc, "-O2", "-o", exe, src, "-lm"], capture_output=True, text=True)
        if r.returncode == 0:
            r = subprocess.run([cc, "-O2", "-o", p2p_exe, p2p_src, "-lm"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"# skipped {name}: {cc} failed:\n{r.stderr}")
            continue
        env = {}
        if name == "openmpi":
            argv = [run, "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1"]
            if a.transport == "tcp":
                argv += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
            else:
                argv += ["--mca", "btl", "self," + ("vader" if has_component("MCA btl: vader") else "sm")]
        elif name == "openmpi-ucx":
            argv = [run, "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ucx",
                    "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any",
                    "-x", "UCX_TLS", "-x", "UCX_NET_DEVICES"]
            env = ({"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"} if a.transport == "tcp"
                   else {"UCX_TLS": "sm,self", "UCX_NET_DEVICES": "all"})
        else:
            argv = [run]
            if a.transport == "tcp":
                env = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"}
        peers[name] = (argv + ["-n", str(a.ranks), exe], env)
    return peers


# One program's run of every size; past this it is reported as hung and the
# round goes on without it (MPICH over UCX's tcp was seen to spin forever
# on one rank once in 15 runs here, the other rank idle).
RUN_TIMEOUT_S = 300


# The launch running now, which a signal to this script must end: in a
# session of its own it would outlive the script (MPICH's ranks, which
# poll, were left spinning on both cores once). A signal that comes while
# a launch is being started waits until it has started.
RUNNING = None
STARTING = False
PENDING = None


def end_launch(p):
    """Ends launch `p`: SIGTERM to its process group, so that a launcher
    can pass it on to ranks in groups of their own (gwrun's ranks are),
    then SIGKILL to the group after 6 s."""
    for sig, wait in ((signal.SIGTERM, 6), (signal.SIGKILL, None)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass


def end_running(signum, _frame):
    global PENDING
    if STARTING:
        PENDING = signum
        return
    if RUNNING is not None:
        end_launch(RUNNING)
    sys.exit(128 + signum)


def run(argv, env, log):
    global RUNNING, STARTING
    e = dict(os.environ)
    e.update(env)
    # A session of its own, so that a hung run's ranks go with their launcher.
    STARTING = True
    p = subprocess.Popen(argv, env=e, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    RUNNING = p
    STARTING = False
    if PENDING is not None:
        end_running(PENDING, None)
    try:
        stdout, stderr = p.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        end_launch(p)
        stdout, stderr = p.communicate()
        with open(log, "w") as f:
            f.write(" ".join(argv) + "\n" + stdout + stderr)
        raise RuntimeError(f"{' '.join(argv[:6])}... ran past {RUN_TIMEOUT_S} s (see {log})") from None
    finally:
        RUNNING = None
    r = subprocess.CompletedProcess(argv, p.returncode, stdout, stderr)
    with open(log, "w") as f:
        f.write(" ".join(argv) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {r.returncode} (see {log})")
    return r.stdout


def gradwire(a, coll, sz, log):
    """{size: busbw}, or for p2p {size: {metric: value}}."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    bindir = os.path.join(target, "release")
    js = log + ".json"
    argv = [os.path.join(bindir, "gwrun"), "-n", str(a.ranks), os.path.join(bindir, "gwbench"), coll,
            "-b", str(sz[0]), "-e", str(sz[-1]), "-f", str(a.factor), "-n", "1", "-w", "5",
            "-T", str(a.seconds), "-c", "1", "-J", js]
    run(argv, {"GW_TRANSPORT": a.transport}, log)
    with open(js) as f:
        doc = json.load(f)
    if not doc.get("ok"):
        raise RuntimeError(f"gwbench found wrong results (see {js})")
    if coll == "p2p":
        return {row["size"]: {m: row[k] for m, k in P2P_METRICS.items()} for row in doc["rows"]}
    return {row["size"]: row[gradwire_column(coll)]["busbw"] for row in doc["rows"]}


def gradwire_column(coll):
    """Which of gwbench's columns is compared: in place for the broadcast,
    whose peers all have one buffer (see the module comment)."""
    return "in_place" if coll == "broadcast" else "out_of_place"


def peer(argv, env, a, coll, sz, log):
    """As gradwire(): the peer program's figures for every size."""
    if coll == "p2p":
        if not argv[-1].startswith(os.path.join(a.out, "mpi_coll.")):
            raise RuntimeError("no point-to-point program for this peer")
        argv = argv[:-1] + [argv[-1].replace("mpi_coll.", "mpi_p2p.")]
        out = run(argv + ["-T", str(a.seconds)] + [f"{s}:1:5" for s in sz], env, log)
    else:
        out = run(argv[:-1] + [argv[-1], coll, "-T", str(a.seconds)] + [f"{s}:1:5" for s in sz], env, log)
    got = {}
    for line in out.splitlines():
        if not line.startswith(("mpi coll=", "gloo coll=")):
            continue
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        if f["wrong"] != "0":
            raise RuntimeError(f"{log}: wrong results: {line}")
        if coll == "p2p":
            got[int(f["size"])] = {"p2p_lat": float(f["lat_us"]), "p2p_bw": float(f["bw"]),
                                   "p2p_bibw": float(f["bibw"])}
        else:
            got[int(f["size"])] = float(f["busbw"])
    return got


def main():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end_running)
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    sz = sizes(a)
    peers = build_peers(a, a.out)
    if "p2p" in a.colls and a.ranks != 2:
        print(f"# skipped p2p: it runs on 2 ranks, not {a.ranks}")
        a.colls = [c for c in a.colls if c != "p2p"]
    # What is reported: every collective, and p2p as its three metrics.
    shown = [m for c in a.colls for m in (P2P_METRICS if c == "p2p" else [c])]
    # busbw[coll][who][size] = [per round]
    bw = {c: {w: {} for w in ["gradwire", *peers]} for c in shown}
    for r in range(a.rounds):
        print(f"# round {r + 1} of {a.rounds}", flush=True)
        order = ["gradwire", *peers]
        if r % 2 == 1:
            order.reverse()
        for c in a.colls:
            for who in order:
                if c == "p2p" and who == "gloo":
                    continue  # no point-to-point program for Gloo here
                log = os.path.join(a.out, f"{c}.{who}.{a.transport}{a.ranks}.r{r}.log")
                try:
                    got = gradwire(a, c, sz, log) if who == "gradwire" else \
                        peer(*peers[who], a, c, sz, log)
                except RuntimeError as e:
                    print(f"# {c} {who}: {e}", flush=True)
                    continue
                for s, v in got.items():
                    for m, x in (v.items() if c == "p2p" else [(c, v)]):
                        bw[m][who].setdefault(s, []).append(x)

    results = {"transport": a.transport, "ranks": a.ranks, "rounds": a.rounds, "seconds": a.seconds,
               "collectives": {}}
    behind = []
    for c in shown:
        lower_better = c == "p2p_lat"
        what = {"p2p_lat": "ping-pong latency us", "p2p_bw": "one-way GB/s",
                "p2p_bibw": "bidirectional GB/s"}.get(c, "busbw GB/s")
        if c in COLLS:
            results.setdefault("gradwire_columns", {})[c] = gradwire_column(c)
            if gradwire_column(c) == "in_place":
                what += ", gradwire's in place"

        print(f"\n{c}, {a.transport}, {a.ranks} ranks: {what} (median over rounds); "
              "gradwire/peer = median [min-max] of per-round ratios"
              + (" of peer/gradwire time (above 1: gradwire faster)" if lower_better else ""))
        head = f"{'bytes':>10} {'gradwire':>9}"
        for p in peers:
            head += f" {p:>9} {'gradwire/' + p:>24}"
        print(head)
        gw = bw[c]["gradwire"]
        rows = {}
        for s in sorted(gw):
            line = f"{s:>10} {statistics.median(gw[s]):>9.3f}"
            row = {"gradwire": statistics.median(gw[s])}
            for p in peers:
                theirs = bw[c][p].get(s)
                if not theirs or len(theirs) != len(gw[s]):
                    line += f" {'n/a':>9} {'n/a':>24}"
                    continue
                ratios = [(t / g if lower_better else g / t) for g, t in zip(gw[s], theirs) if t > 0 and g > 0]
                med = statistics.median(ratios)
                mark = " behind" if s >= BEHIND_FROM and med < 1.0 else ""
                if mark:
                    behind.append(f"{c} {s} vs {p}: {med:.2f}")
                line += f" {statistics.median(theirs):>9.3f} {f'{med:.2f} [{min(ratios):.2f}-{max(ratios):.2f}]{mark}':>24}"
                row[p] = statistics.median(theirs)
                row[f"ratio_{p}"] = med
                row[f"ratio_{p}_range"] = [min(ratios), max(ratios)]
            rows[s] = row
            print(line)
        results["collectives"][c] = rows
    with open(os.path.join(a.out, f"results.{a.transport}{a.ranks}.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\nbehind a peer from 64 KiB up: " + ("; ".join(behind) if behind else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
