"""Mid-size all-reduces before and after big ones, on one communicator.

A training job's buckets mix sizes, while gwbench sweeps them upwards.
Over TCP loopback, a socket whose send buffer let it run megabytes ahead
once stays slower for later 256 KiB-1 MiB messages (docs/performance.md,
"TCP send buffers"), so this times 256 KiB and 1 MiB all-reduces on a fresh
communicator, then after 40 all-reduces of 8 MiB, and prints both, the
slower rank's time per call. Alternate runs with different settings to
compare them:

    GW_TRANSPORT=tcp GW_SOCKET_SEND_BUFFER_BYTES=2097152 \\
        gwrun -n 2 python3 scripts/tcp-mixed-sizes.py
    GW_TRANSPORT=tcp gwrun -n 2 python3 scripts/tcp-mixed-sizes.py

with `python/` on PYTHONPATH and GRADWIRE_LIB naming a release
libgradwire.so. The optional argument is the 256 KiB loop's count (the
1 MiB loop runs a third of it); fixed counts, so that every rank runs the
same schedule.
"""

import sys
import time

import numpy as np

import gradwire


def timed(comm, nbytes, iters):
    a = np.ones(nbytes // 4, np.float32)
    for _ in range(20):
        comm.allreduce(a)
    comm.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        comm.allreduce(a)
    per_call = np.array([(time.perf_counter() - t) / iters * 1e6], np.float64)
    comm.allreduce(per_call, op="max")
    return per_call[0]


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    if iters < 3:
        sys.exit("tcp-mixed-sizes.py: the loop count must be at least 3")
    comm = gradwire.init()
    loops = ((256 << 10, iters), (1 << 20, iters // 3))
    fresh = [timed(comm, n, k) for n, k in loops]
    timed(comm, 8 << 20, 40)
    after = [timed(comm, n, k) for n, k in loops]
    if comm.rank == 0:
        print(
            "fresh: 256 KiB %.0f us, 1 MiB %.0f us | after 8 MiB: 256 KiB %.0f us, 1 MiB %.0f us"
            % (*fresh, *after),
            flush=True,
        )
    comm.destroy()


if __name__ == "__main__":
    main()
