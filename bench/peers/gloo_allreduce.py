"""Gloo float32 sum all-reduce through pygloo, timed as nccl-tests (and gwbench) do.

Run by scripts/compare-peers.sh, one process per rank:

    RANK=r WORLD_SIZE=n STORE_DIR=dir python gloo_allreduce.py SIZE:ITERS:WARMUP ...

Ranks meet through a Gloo FileStore in STORE_DIR and connect a full mesh over
Gloo's TCP transport on loopback. For each size: fill the buffers, run WARMUP
untimed calls, barrier, then ITERS timed calls out of place (separate send and
receive buffers) with Gloo's ring all-reduce; the time is the mean per call,
the largest over ranks. One checked call follows. Rank 0 prints one line per
size:

    gloo size=BYTES ranks=N iters=I time_us=T algbw=GB/s busbw=GB/s wrong=W

GB = 1e9 bytes, algbw = size / time, busbw = algbw * 2(n-1)/n.
"""

import os
import sys
import time

import numpy as np
import pygloo


def parse(arg):
    size, iters, warmup = (int(x) for x in arg.split(":"))
    if iters < 1 or warmup < 0:
        raise SystemExit(f"gloo_allreduce: bad argument {arg!r} (want SIZE:ITERS:WARMUP)")
    return size, iters, warmup


def main():
    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    store_dir = os.environ["STORE_DIR"]
    runs = [parse(a) for a in sys.argv[1:]]
    if not runs:
        raise SystemExit("usage: gloo_allreduce.py SIZE:ITERS:WARMUP ...")

    context = pygloo.rendezvous.Context(rank, n)
    attr = pygloo.transport.tcp.attr("127.0.0.1")
    device = pygloo.transport.tcp.CreateDevice(attr)
    # pygloo keeps no reference to the store: if these objects are collected
    # while the context uses them, the process crashes. Hold them until exit.
    file_store = pygloo.rendezvous.FileStore(store_dir)
    store = pygloo.rendezvous.PrefixStore(str(n), file_store)
    context.connectFullMesh(store, device)

    f32 = pygloo.glooDataType_t.glooFloat32
    f64 = pygloo.glooDataType_t.glooFloat64
    ring = pygloo.allreduceAlgorithm.RING

    def allreduce(send, recv, count, dtype=f32, op=pygloo.ReduceOp.SUM):
        pygloo.allreduce(context, send.ctypes.data, recv.ctypes.data, count, dtype, op, ring)

    max_count = max(max(size // 4, 1) for size, _, _ in runs)
    send_all = np.zeros(max_count, dtype=np.float32)
    recv_all = np.zeros(max_count, dtype=np.float32)
    one_in = np.zeros(1, dtype=np.float64)
    one_out = np.zeros(1, dtype=np.float64)

    for size, iters, warmup in runs:
        count = max(size // 4, 1)
        send = send_all[:count]
        recv = recv_all[:count]
        # Small integers: every partial sum is exact in float32.
        pattern = (np.arange(count, dtype=np.uint32) % 7).astype(np.float32)
        np.add(pattern, rank + 1, out=send)
        for _ in range(warmup):
            allreduce(send, recv, count)
        pygloo.barrier(context)
        t0 = time.perf_counter()
        for _ in range(iters):
            allreduce(send, recv, count)
        one_in[0] = (time.perf_counter() - t0) / iters
        allreduce(one_in, one_out, 1, f64, pygloo.ReduceOp.MAX)
        slowest = float(one_out[0])

        recv[:] = np.nan
        allreduce(send, recv, count)
        want = pattern
        want *= n
        want += n * (n + 1) // 2
        one_in[0] = float(np.count_nonzero(recv != want))
        del pattern, want
        allreduce(one_in, one_out, 1, f64, pygloo.ReduceOp.SUM)

        if rank == 0:
            nbytes = count * 4
            algbw = nbytes / slowest / 1e9
            busbw = algbw * 2 * (n - 1) / n
            print(
                f"gloo size={nbytes} ranks={n} iters={iters} time_us={slowest * 1e6:.3f} "
                f"algbw={algbw:.6g} busbw={busbw:.6g} wrong={int(one_out[0])}",
                flush=True,
            )
    pygloo.barrier(context)
    # Keep the store objects alive up to here (see above).
    del context, store, file_store


if __name__ == "__main__":
    main()
