"""gloo_coll: every collective gwbench measures, through PyTorch's Gloo
backend, timed as nccl-tests (and gwbench, and mpi_coll.c) do, for
scripts/compare-collectives.py.

    python3 bench/peers/gloo_coll.py -n RANKS COLL[,COLL...] [-T SECONDS] SIZE:ITERS:WARMUP ...

It starts RANKS processes of itself on this host (torch.distributed's env://
rendezvous on a free loopback port); Gloo connects them over TCP on
loopback (Gloo has no shared-memory transport for CPU tensors). COLL is
allreduce, reduce_scatter, allgather, broadcast or reduce (several, comma
separated, run one after the other in one launch: starting the ranks, which
import torch, takes seconds), on float32 with sum (root 0 where there is
one). SIZE is nccl-tests' size in bytes: the
buffer of allreduce, broadcast and reduce, the whole (all ranks') buffer of
reduce_scatter and allgather, whose per-rank blocks are rounded down to
whole 16-byte units as gwbench's are. For each size: WARMUP untimed calls, a
barrier, then ITERS timed calls out of place (in place for broadcast); with
-T the count is sized by time instead: 1, 2, 4, ... calls until a batch
lasts a tenth of SECONDS on the slowest rank, scaled to SECONDS, at least
ITERS. The time is the mean per call of the slowest rank. One more call is
then checked against the exact result on every rank. Rank 0 prints:

    gloo coll=C size=BYTES ranks=N iters=I time_us=T algbw=GB/s busbw=GB/s wrong=W

GB = 1e9 bytes, algbw = size / time, busbw = algbw * 2(n-1)/n for
allreduce, (n-1)/n for reduce_scatter and allgather, 1 for broadcast and
reduce (nccl-tests' definitions). The exit status is 0 only if every rank
finished and no element was wrong.
"""

import math
import os
import socket
import subprocess
import sys
import time

COLLS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]
MOST = 1 << 27


def usage(msg):
    sys.stderr.write(f"gloo_coll: {msg}\n")
    sys.stderr.write("usage: gloo_coll.py -n RANKS COLL[,COLL...] [-T SECONDS] SIZE:ITERS:WARMUP ...\n")
    sys.exit(2)


def parse(argv):
    """(ranks, coll, seconds, [(size, iters, warmup)]) or a usage error."""
    if len(argv) < 4 or argv[0] != "-n":
        usage("need -n RANKS COLL and at least one SIZE:ITERS:WARMUP")
    try:
        ranks = int(argv[1])
    except ValueError:
        usage(f"-n {argv[1]!r} is not a number")
    if not 1 <= ranks <= 64:
        usage(f"-n {ranks}: between 1 and 64 ranks")
    colls = argv[2].split(",")
    for coll in colls:
        if coll not in COLLS:
            usage(f"COLL {coll!r} must be one of {', '.join(COLLS)}")
    rest = argv[3:]
    seconds = 0.0
    if rest and rest[0] == "-T":
        try:
            seconds = float(rest[1])
        except (IndexError, ValueError):
            usage("-T needs SECONDS")
        if not 0 < seconds <= 3600:
            usage("-T SECONDS must be in (0, 3600]")
        rest = rest[2:]
    runs = []
    for a in rest:
        try:
            size, iters, warmup = (int(x) for x in a.split(":"))
        except ValueError:
            usage(f"bad argument {a!r} (want SIZE:ITERS:WARMUP)")
        if size < 0 or iters < 1 or warmup < 0:
            usage(f"bad argument {a!r} (want SIZE >= 0, ITERS >= 1, WARMUP >= 0)")
        runs.append((size, iters, warmup))
    if not runs:
        usage("need at least one SIZE:ITERS:WARMUP")
    return ranks, colls, seconds, runs


def launch(argv):
    """Runs one process per rank; returns the exit status."""
    ranks = int(argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GLOO_COLL_CHILD="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env))
    status = 0
    for r, p in enumerate(procs):
        rc = p.wait()
        if rc != 0:
            sys.stderr.write(f"gloo_coll: rank {r} exited with {rc}\n")
            status = status or rc
    return status


def rank_main(argv):
    import torch
    import torch.distributed as dist

    _, colls, seconds, runs = parse(argv)
    dist.init_process_group("gloo")
    wrong = 0
    for coll in colls:
        wrong += run_coll(dist, torch, coll, seconds, runs)
        if wrong:
            break
    dist.destroy_process_group()
    return 1 if wrong else 0


def run_coll(dist, torch, coll, seconds, runs):
    """Times and checks `coll` at every size; the wrong elements, summed
    over ranks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    per_rank = coll in ("reduce_scatter", "allgather")

    def block(size):
        elems = size // 4
        k = elems // n // 4 * 4 if per_rank else elems
        return max(k, 1)

    def inputs(r, at, count):
        # Small integers: every partial sum is exact in float32.
        i = torch.arange(at, at + count, dtype=torch.int64)
        return (r + 1 + i % 7).to(torch.float32)

    def reduced(at, count):
        i = torch.arange(at, at + count, dtype=torch.int64)
        return (n * (n + 1) // 2 + n * (i % 7)).to(torch.float32)

    def slowest(t):
        x = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.item()

    total_max = max(block(s) * (n if per_rank else 1) for s, _, _ in runs)
    send_all = torch.zeros(total_max, dtype=torch.float32)
    recv_all = torch.zeros(total_max, dtype=torch.float32)

    for size, iters, warmup in runs:
        k = block(size)
        total = k * n if per_rank else k
        nbytes = total * 4
        if coll == "reduce_scatter":
            send, recv = send_all[:total], recv_all[:k]
            call = lambda: dist.reduce_scatter_tensor(recv, send)  # noqa: E731
            fill = lambda: send.copy_(inputs(rank, 0, total))  # noqa: E731
        elif coll == "allgather":
            send, recv = send_all[:k], recv_all[:total]
            call = lambda: dist.all_gather_into_tensor(recv, send)  # noqa: E731
            fill = lambda: send.copy_(inputs(rank, k * rank, k))  # noqa: E731
        elif coll == "allreduce":
            # torch's all-reduce works in place: copying the input first
            # would time a copy that no other benchmark here does, so the
            # timed loop reduces in place (the values grow; only the
            # checked call below is compared).
            send, recv = send_all[:k], send_all[:k]
            call = lambda: dist.all_reduce(send)  # noqa: E731
            fill = lambda: send.copy_(inputs(rank, 0, k))  # noqa: E731
        elif coll == "broadcast":
            send, recv = send_all[:k], send_all[:k]
            call = lambda: dist.broadcast(send, 0)  # noqa: E731
            fill = lambda: send.copy_(inputs(rank, 0, k))  # noqa: E731
        else:
            send, recv = send_all[:k], send_all[:k]
            call = lambda: dist.reduce(send, 0)  # noqa: E731
            fill = lambda: send.copy_(inputs(rank, 0, k))  # noqa: E731

        def timed(count):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(count):
                call()
            return slowest(time.perf_counter() - t0)

        fill()
        for _ in range(warmup):
            call()
        if seconds > 0:
            c = 1
            while True:
                t = timed(c)
                if t >= seconds / 10 or c >= MOST:
                    iters = max(iters, min(MOST, math.ceil(c * seconds / max(t, 1e-9))))
                    break
                c *= 2
        per_call = timed(iters) / iters

        fill()
        if coll == "broadcast" and rank != 0:
            send.fill_(float("nan"))
        if coll in ("reduce_scatter", "allgather"):
            recv.fill_(float("nan"))
        call()
        if coll == "allreduce" or (coll == "reduce" and rank == 0):
            want = reduced(0, k)
        elif coll == "reduce_scatter":
            want = reduced(k * rank, k)
        elif coll == "allgather":
            want = torch.cat([inputs(r, k * r, k) for r in range(n)])
        elif coll == "broadcast":
            want = inputs(0, 0, k)
        else:
            want = None
        wrong = 0 if want is None else int((recv != want).sum().item())
        w = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(w)
        if rank == 0:
            algbw = nbytes / per_call / 1e9
            factor = 2 * (n - 1) / n if coll == "allreduce" else (n - 1) / n if per_rank else 1.0
            print(f"gloo coll={coll} size={nbytes} ranks={n} iters={iters} time_us={per_call * 1e6:.3f} "
                  f"algbw={algbw:.6g} busbw={algbw * factor:.6g} wrong={w.item()}", flush=True)
        if w.item() != 0:
            return w.item()
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if os.environ.get("GLOO_COLL_CHILD") == "1":
        sys.exit(rank_main(args))
    parse(args)
    sys.exit(launch(args))
