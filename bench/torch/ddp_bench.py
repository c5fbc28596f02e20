"""gradwire against Gloo as PyTorch backends, in one run: DDP training steps
of a 25 M-parameter model, and dist.all_reduce from 64 KiB to 256 MiB.

    gwrun -n 2 python bench/torch/ddp_bench.py                 # shared memory
    GW_TRANSPORT=tcp gwrun -n 2 python bench/torch/ddp_bench.py
    gwrun -n 2 python bench/torch/ddp_bench.py --rounds 5 --seconds 2

Each rank holds two process groups, Gloo's (the default group) and
gradwire's, and the rounds alternate between them, so both see the same
machine of the moment. Every timed loop runs for about --seconds (after
warm-up), and a round's time is the slowest rank's mean. Printed: each
round's times and the median over rounds of the per-round ratio
gloo/gradwire (above 1: gradwire faster), with the spread of the ratios.

The DDP rounds also time a third model whose gradients are not exchanged
at all (a DDP communication hook that hands each bucket back untouched):
the step's floor on this machine, with the same forward, backward,
bucketing and update. gloo/floor bounds what any backend can reach as
gloo/gradwire here.

Each DDP round also prints where the rank's CPU time went, per step, on the
slowest rank: the main thread (forward, backward, update, and whatever a
backend runs on it) and every other thread of the process (the backend's
engine and waiter threads; Gloo's own). With one core per rank a step
cannot take less than their sum, so a backend's cost to a CPU-bound step is
its threads' CPU time, not its all-reduce's latency.
"""

import argparse
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.torch  # noqa: F401


def slowest(seconds, group):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def thread_cpu():
    """{thread id: CPU seconds so far} for every thread of this process
    (Linux /proc; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def cpu_split(before, after, main_tid):
    """(main thread, all other threads) CPU seconds between two snapshots."""
    main = after.get(main_tid, 0.0) - before.get(main_tid, 0.0)
    other = sum(v - before.get(t, 0.0) for t, v in after.items() if t != main_tid)
    return main, other


def timed(fn, seconds, group, warmup=2, cpu=None):
    """Mean seconds per call over a loop of about `seconds`, slowest rank.
    The count is agreed on (rank 0's) so every rank makes the same calls.
    With a list `cpu`, appends (main thread, other threads) CPU seconds per
    call, each the largest over the ranks."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    n = torch.tensor([max(1, int(seconds / max(one, 1e-6)))], dtype=torch.int64)
    dist.broadcast(n, 0, group=group)
    n = int(n.item())
    main_tid = threading.main_thread().native_id
    c0 = thread_cpu()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t0
    if cpu is not None:
        main, other = cpu_split(c0, thread_cpu(), main_tid)
        cpu.append((slowest(main / n, group), slowest(other / n, group)))
    return slowest(elapsed / n, group)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024))


def no_comm_hook(state, bucket):
    """A DDP communication hook that exchanges nothing."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def ratio_line(label, gloo, gw):
    ratios = [g / w for g, w in zip(gloo, gw)]
    return (f"{label:>12}  gloo {statistics.median(gloo) * 1e3:9.3f} ms  gradwire {statistics.median(gw) * 1e3:9.3f} ms"
            f"  gloo/gradwire {statistics.median(ratios):5.2f}x  (rounds {min(ratios):.2f}-{max(ratios):.2f})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (torchrun's default: 1)")
    p.add_argument("--min-bytes", type=int, default=64 << 10)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--skip-ddp", action="store_true")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "gradwire": dist.new_group(backend="gradwire")}
    params = sum(q.numel() for q in model().parameters())
    if rank == 0:
        print(f"# {n} ranks, {a.rounds} interleaved rounds, loops of ~{a.seconds} s; torch {torch.__version__}, "
              f"{a.threads} thread(s) per rank, DDP batch {a.batch} per rank")

    if not a.skip_ddp:
        nets = {k: DDP(model(), process_group=g) for k, g in groups.items()}
        nets["floor"] = DDP(model(), process_group=groups["gradwire"])
        nets["floor"].register_comm_hook(None, no_comm_hook)
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in nets.items()}
        x = torch.randn(a.batch, 1024, generator=torch.Generator().manual_seed(rank))
        y = torch.randn(a.batch, 1024, generator=torch.Generator().manual_seed(rank + 100))

        def step(k):
            def f():
                opts[k].zero_grad()
                nn.functional.mse_loss(nets[k](x), y).backward()
                opts[k].step()
            return f

        t = {"gloo": [], "gradwire": [], "floor": []}
        cpu = {k: [] for k in t}
        for r in range(a.rounds):
            for k in ("gloo", "gradwire", "floor") if r % 2 == 0 else ("floor", "gradwire", "gloo"):
                t[k].append(timed(step(k), a.seconds, groups["gloo"], cpu=cpu[k]))
            if rank == 0:
                print(f"  round {r}: DDP step gloo {t['gloo'][-1] * 1e3:.2f} ms, gradwire {t['gradwire'][-1] * 1e3:.2f} ms, "
                      f"no communication {t['floor'][-1] * 1e3:.2f} ms")
                print("           CPU per step, main thread + other threads: " + ", ".join(
                    f"{k} {cpu[k][-1][0] * 1e3:.1f} + {cpu[k][-1][1] * 1e3:.1f} ms" for k in t))
        if rank == 0:
            print(ratio_line(f"DDP {params / 1e6:.1f}M", t["gloo"], t["gradwire"]))
            print(ratio_line("floor", t["gloo"], t["floor"]).replace("gradwire", "no-comm"))
            print("  CPU per step, median over rounds, main thread + other threads: " + ", ".join(
                f"{k} {statistics.median(c[0] for c in cpu[k]) * 1e3:.1f} + "
                f"{statistics.median(c[1] for c in cpu[k]) * 1e3:.1f} ms" for k in t))

    size = a.min_bytes
    if rank == 0:
        print(f"# dist.all_reduce, float32; busbw = bytes * 2(n-1)/n / time")
    while size <= a.max_bytes:
        buf = torch.ones(size // 4)
        t = {"gloo": [], "gradwire": []}
        for r in range(a.rounds):
            for k in ("gloo", "gradwire") if r % 2 == 0 else ("gradwire", "gloo"):
                t[k].append(timed(lambda: dist.all_reduce(buf, group=groups[k]), a.seconds / 3, groups["gloo"], warmup=1))
        if rank == 0:
            bw = lambda s: size * 2 * (n - 1) / n / s / 1e9
            line = ratio_line(f"{size >> 10} KiB", t["gloo"], t["gradwire"])
            print(f"{line}  busbw GB/s gloo {bw(statistics.median(t['gloo'])):.2f} gradwire {bw(statistics.median(t['gradwire'])):.2f}")
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
