#!/usr/bin/env python3
"""gradwire's collectives on CUDA tensors, run under gwrun on a GPU machine
(scripts/gpu-bundle.sh puts it in the bundle; DIR/gpu-check.sh runs it).

  gwrun -n N python3 gpu_collectives.py check      correctness; prints PASS/FAIL lines
  gwrun -n N python3 gpu_collectives.py bench OUT  bandwidth against Gloo and the host path

Every rank regenerates every rank's input from a seed, so each can compute
the expected result alone. The all-reduce on device buffers of ranks that
share a GPU goes the IPC way: rank 0's kernel reduces every rank's buffer
in rank order (each step: widen, combine, round to the element type), so
the reference applies the same steps on the host. Everything else is staged
through the host path, so its reference is the host path itself, called on
host copies of the same data.
"""
import ctypes
import json
import zlib
import os
import statistics
import sys
import time

import numpy as np
import torch

import gradwire

C = gradwire._C
DT = {torch.uint8: 0, torch.int32: 1, torch.int64: 2, torch.float16: 3, torch.bfloat16: 4,
      torch.float32: 5, torch.float64: 6}
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
           torch.float64: torch.float64}

comm = gradwire.init()
H = comm._handle()
rank, n = comm.rank, comm.size
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
results = []


def call(fname, *args):
    rc = getattr(C, fname)(*args)
    if rc != 0:
        msg = C.gwGetLastError(H)
        raise RuntimeError(f"{fname} -> {rc}: {msg.decode() if msg else ''}")


def data(r, case, dtype, count):
    g = torch.Generator().manual_seed(zlib.crc32(f"{r}|{case}".encode()))
    if dtype in FLOATS:
        x = torch.randn(count, generator=g, dtype=torch.float64) * 4 + 0.5
        return x.to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (count,), generator=g, dtype=torch.int64).to(torch.uint8)
    return torch.randint(-(1 << 30), 1 << 30, (count,), generator=g, dtype=torch.int64).to(dtype)


def step(op, p, q, dtype, div=None):
    """One kernel step on the host: widen, combine, (divide), round."""
    if dtype in FLOATS:
        ct = COMPUTE[dtype]
        a, b = p.to(ct), q.to(ct)
        r = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.fmin, "max": torch.fmax}[op](a, b)
        if div is not None:
            r = r / torch.tensor(div, dtype=ct)
        return r.to(dtype)
    a, b = p.numpy(), q.numpy()
    with np.errstate(over="ignore"):
        r = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op](a, b)
    return torch.from_numpy(np.asarray(r, dtype=a.dtype))


def chain_reference(inputs, op, dtype):
    """Rank 0's fan kernel: ((x0 . x1) . x2) ..., one rounded step each,
    the last divided by n for avg."""
    acc = inputs[0].clone()
    if n == 1:
        if op == "avg":
            acc = (acc.to(COMPUTE[dtype]) / torch.tensor(1.0, dtype=COMPUTE[dtype])).to(dtype)
        return acc
    for j in range(1, n):
        acc = step(op, acc, inputs[j], dtype, div=float(n) if (op == "avg" and j == n - 1) else None)
    return acc


def same(got, want):
    g, w = got.cpu(), want.cpu()
    if g.dtype in FLOATS:
        gn, wn = torch.isnan(g.float()), torch.isnan(w.float())
        if not torch.equal(gn, wn):
            return False
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[g.element_size()]
        return torch.equal(g.view(bits)[~gn], w.view(bits)[~wn])
    return torch.equal(g, w)


def record(name, ok, detail=""):
    results.append((name, ok))
    if rank == 0 or not ok:
        print(f"{'PASS' if ok else 'FAIL'} rank {rank} {name} {detail}", flush=True)


def check_all_reduce(staged):
    for dtype in DT:
        ops = ["sum", "prod", "min", "max"] + (["avg"] if dtype in FLOATS else [])
        for op in ops:
            for count in (1, 1000, 65537):
                for in_place in (False, True):
                    case = f"allreduce {str(dtype)[6:]} {op} n={count} {'in' if in_place else 'out of'} place"
                    inputs = [data(r, case, dtype, count) for r in range(n)]
                    x = inputs[rank].to(dev)
                    y = x if in_place else torch.empty_like(x)
                    try:
                        call("gwAllReduce", x.data_ptr(), y.data_ptr(), count, DT[dtype], OPS[op], H)
                        if staged:
                            h = inputs[rank].clone()
                            call("gwAllReduce", h.data_ptr(), h.data_ptr(), count, DT[dtype], OPS[op], H)
                            want = h
                        else:
                            want = chain_reference(inputs, op, dtype)
                        record(case, same(y, want))
                    except RuntimeError as e:
                        record(case, False, str(e))


def check_others():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        for count in (7, 100003):
            base = f"{str(dtype)[6:]} n={count}"
            send = [data(r, base + "rs", dtype, count * n) for r in range(n)]
            # reduce-scatter, out of place and in place
            for in_place in (False, True):
                name = f"reducescatter {base} {'in' if in_place else 'out of'} place"
                try:
                    xs = send[rank].to(dev)
                    out = xs[rank * count:(rank + 1) * count] if in_place else torch.empty(count, dtype=dtype, device=dev)
                    call("gwReduceScatter", xs.data_ptr(), out.data_ptr(), count, DT[dtype], 0, H)
                    hs = send[rank].clone()
                    hout = torch.empty(count, dtype=dtype)
                    call("gwReduceScatter", hs.data_ptr(), hout.data_ptr(), count, DT[dtype], 0, H)
                    record(name, same(out, hout))
                except RuntimeError as e:
                    record(name, False, str(e))
            mine = data(rank, base + "ag", dtype, count)
            for in_place in (False, True):
                name = f"allgather {base} {'in' if in_place else 'out of'} place"
                try:
                    out = torch.zeros(count * n, dtype=dtype, device=dev)
                    if in_place:
                        out[rank * count:(rank + 1) * count] = mine.to(dev)
                        src = out[rank * count:(rank + 1) * count]
                    else:
                        src = mine.to(dev)
                    call("gwAllGather", src.data_ptr(), out.data_ptr(), count, DT[dtype], H)
                    want = torch.cat([data(r, base + "ag", dtype, count) for r in range(n)])
                    record(name, same(out, want))
                except RuntimeError as e:
                    record(name, False, str(e))
            root = n - 1
            name = f"broadcast {base} root {root}"
            try:
                b = data(root, base + "bc", dtype, count).to(dev) if rank == root else torch.zeros(count, dtype=dtype, device=dev)
                call("gwBroadcast", b.data_ptr(), b.data_ptr(), count, DT[dtype], root, H)
                record(name, same(b, data(root, base + "bc", dtype, count)))
            except RuntimeError as e:
                record(name, False, str(e))
            name = f"reduce {base} root 0"
            try:
                x = data(rank, base + "rd", dtype, count)
                xd, out = x.to(dev), torch.zeros(count, dtype=dtype, device=dev)
                call("gwReduce", xd.data_ptr(), out.data_ptr(), count, DT[dtype], 0, 0, H)
                hout = torch.zeros(count, dtype=dtype)
                call("gwReduce", x.data_ptr(), hout.data_ptr(), count, DT[dtype], 0, 0, H)
                record(name, rank != 0 or same(out, hout))
            except RuntimeError as e:
                record(name, False, str(e))
    # Every receive buffer on the device, the root's send buffer in host
    # memory, large enough to be pipelined (12 MiB > GW_CUDA_STAGE_BYTES).
    name = "broadcast from a host send buffer into device receive buffers, pipelined"
    try:
        count = 3 << 20
        want = data(0, "mixed-big", torch.float32, count)
        out = torch.zeros(count, device=dev)
        src = want if rank == 0 else torch.zeros(1)
        call("gwBroadcast", src.data_ptr(), out.data_ptr(), count, DT[torch.float32], 0, H)
        record(name, same(out, want))
    except RuntimeError as e:
        record(name, False, str(e))
    # Point to point between neighbours, device buffers both sides.
    if n > 1:
        name = "sendrecv device buffers"
        try:
            count = 300007
            mine = data(rank, "p2p", torch.float32, count).to(dev)
            got = torch.zeros(count, device=dev)
            right, left = (rank + 1) % n, (rank - 1) % n
            call_sr = C.gwSendRecv
            rc = call_sr(mine.data_ptr(), count, right, got.data_ptr(), count, left, DT[torch.float32], H)
            if rc != 0:
                raise RuntimeError(f"gwSendRecv -> {rc}: {C.gwGetLastError(H)}")
            record(name, same(got, data(left, "p2p", torch.float32, count)))
        except RuntimeError as e:
            record(name, False, str(e))


def check_stream_order():
    name = "stream ordering: kernel before, kernel after, no host sync"
    s = torch.cuda.Stream()
    count = 1 << 22
    x = torch.zeros(count, device=dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keeps the stream busy ~tens of ms
        x.fill_(rank + 1.0)
        call("gwAllReduceStream", x.data_ptr(), x.data_ptr(), count, DT[torch.float32], 0, H, s.cuda_stream)
        y = x * 2
    s.synchronize()
    want = 2.0 * sum(r + 1.0 for r in range(n))
    record(name, bool(torch.all(y == want)), f"got {y[0].item()} want {want}")


def check_errors():
    name = "a freed device pointer is named"
    # 256 MiB: a segment of its own, which empty_cache really frees.
    t = torch.ones(1 << 26, device=dev)
    p = t.data_ptr()
    del t
    torch.cuda.empty_cache()
    rc = C.gwAllReduce(p, p, 1 << 20, DT[torch.float32], 0, H)
    msg = (C.gwGetLastError(H) or b"").decode()
    record(name, rc != 0 and "live device allocation" in msg and "sendbuff" in msg, f"rc={rc} {msg}")
    name = "a count past the allocation is named"
    t = torch.ones(1000, device=dev)
    # Past the allocator's whole segment, not just the tensor (which is all
    # the driver can see).
    rc = C.gwAllReduce(t.data_ptr(), t.data_ptr(), 1 << 28, DT[torch.float32], 0, H)
    msg = (C.gwGetLastError(H) or b"").decode()
    record(name, rc != 0 and "run past the end" in msg, f"rc={rc} {msg}")
    name = "async calls refuse device memory by name"
    req = ctypes.c_void_p()
    rc = C.gwAllReduceAsync(t.data_ptr(), t.data_ptr(), 1000, DT[torch.float32], 0, H, ctypes.byref(req))
    msg = (C.gwGetLastError(H) or b"").decode()
    record(name, rc != 0 and "Stream call" in msg, f"rc={rc} {msg}")


def check_persistent():
    """gwAllReduceInit on device buffers: rounds with new data each time,
    started with gwStart and with gwStartStream on a torch stream."""
    for dtype, op, count in ((torch.float32, "sum", 1 << 20), (torch.float16, "avg", 65537),
                             (torch.int64, "max", 1000)):
        name = f"persistent {str(dtype)[6:]} {op} n={count}"
        try:
            x = torch.empty(count, dtype=dtype, device=dev)
            y = torch.empty_like(x)
            req = ctypes.c_void_p()
            call("gwAllReduceInit", x.data_ptr(), y.data_ptr(), count, DT[dtype], OPS[op], H, ctypes.byref(req))
            ok = True
            for rnd in range(12):
                inputs = [data(r, f"{name} round {rnd}", dtype, count) for r in range(n)]
                x.copy_(inputs[rank])
                want = chain_reference(inputs, op, dtype)
                if rnd % 2 == 0:
                    call("gwStart", req)
                    call("gwWait", req, 10000)  # a hang is a failure, not a stuck check
                    got = y
                else:
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        call("gwStartStream", req, s.cuda_stream)
                        got = y.clone()
                    t0 = time.time()
                    while not s.query():
                        if time.time() - t0 > 10:
                            raise RuntimeError("gwStartStream: the stream did not finish in 10 s")
                        time.sleep(0.001)
                if not same(got, want):
                    ok = False
                    break
            call("gwRequestFree", req)
            record(name, ok)
        except RuntimeError as e:
            record(name, False, str(e))


def check_python_api():
    """The package's own calls on CUDA tensors: results come back as
    tensors on the device, with and without a stream."""
    name = "python api: allreduce, broadcast, allgather on torch CUDA tensors"
    try:
        x = torch.full((1000,), float(rank + 1), device=dev)
        y = comm.allreduce(x)
        ok = isinstance(y, torch.Tensor) and y.is_cuda and bool(torch.all(y == sum(range(1, n + 1))))
        comm.allreduce(x, out=x)
        ok = ok and bool(torch.all(x == sum(range(1, n + 1))))
        b = comm.broadcast(torch.full((10,), float(rank), device=dev), root=n - 1)
        ok = ok and b.is_cuda and bool(torch.all(b == n - 1))
        g = comm.allgather(torch.full((3,), float(rank), device=dev))
        ok = ok and tuple(g.shape) == (n, 3) and bool(torch.all(g[:, 0].cpu() == torch.arange(n, dtype=torch.float32)))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            z = torch.ones(5000, device=dev)
            comm.allreduce(z, out=z, stream=s)
            w = z * 3
        s.synchronize()
        ok = ok and bool(torch.all(w == 3 * n))
        record(name, ok)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        record(name, False, repr(e))


def check_big():
    name = "4 GiB all-reduce"
    count = 1 << 30
    try:
        x = torch.full((count,), float(rank + 1), device=dev)
        call("gwAllReduce", x.data_ptr(), x.data_ptr(), count, DT[torch.float32], 0, H)
        want = float(sum(r + 1 for r in range(n)))
        ok = bool(torch.all(x == want))
        del x
        torch.cuda.empty_cache()
        record(name, ok)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        record(name, False, str(e))


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    call("gwAllReduce", t.data_ptr(), t.data_ptr(), 1, DT[torch.float64], OPS["max"], H)
    return t.item()


def timed(fn, budget=0.25, min_iters=3):
    """Iterations sized by time; returns the slowest rank's seconds per call."""
    fn()
    torch.cuda.synchronize()
    iters = 1
    while True:
        call("gwBarrier", H)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        dt = slowest(time.perf_counter() - t0)
        if dt >= budget or iters >= 1 << 14:
            return dt / iters
        iters = max(min_iters, int(iters * min(8.0, 1.3 * budget / max(dt, 1e-6))))


def bench(out):
    import torch.distributed as dist
    store = dist.FileStore(os.environ.get("GW_GLOO_STORE", "/tmp/gw-gloo-store"), n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    rounds = int(os.environ.get("GW_BENCH_ROUNDS", "3"))
    rows = []
    # The copy ceiling: bytes read plus written by a device-to-device copy.
    # Measured by rank 0 alone (the others wait), so that it is the GPU's.
    copy_bw = 0.0
    if rank == 0:
        a = torch.empty(1 << 28, device=dev)
        b = torch.empty_like(a)
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0, k = time.perf_counter(), 0
            while time.perf_counter() - t0 < 0.1:
                for _ in range(10):
                    b.copy_(a)
                k += 10
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / k)
        copy_bw = 2 * a.numel() * 4 / statistics.median(samples)
        del a, b
        torch.cuda.empty_cache()
    call("gwBarrier", H)
    if rank == 0:
        print(f"# device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + written)", flush=True)
        print(f"# {'size':>12} {'peer':>16} {'time(us)':>10} {'algbw':>8} {'busbw':>8}  rounds", flush=True)
    for size in sizes:
        count = size // 4
        x = torch.ones(count, device=dev)
        peers = {
            "gradwire-ipc": lambda: call("gwAllReduce", x.data_ptr(), x.data_ptr(), count, 5, 0, H),
            "gradwire-host": None,
            "gloo": (lambda: dist.all_reduce(x)) if size <= (64 << 20) else None,
        }
        times = {k: [] for k in peers}
        for _ in range(rounds):
            for name in peers:
                if name == "gradwire-host":
                    if size > (256 << 20):
                        continue
                    os.environ["GW_CUDA_IPC"] = "0"
                    times[name].append(timed(peers["gradwire-ipc"]))
                    os.environ.pop("GW_CUDA_IPC")
                elif peers[name] is not None:
                    times[name].append(timed(peers[name]))
        for name, ts in times.items():
            if not ts:
                continue
            med = statistics.median(ts)
            algbw = size / med / 1e9
            busbw = algbw * 2 * (n - 1) / n
            row = {"bytes": size, "peer": name, "ranks": n, "median_s": med, "rounds_s": ts,
                   "algbw_GBps": algbw, "busbw_GBps": busbw}
            rows.append(row)
            if rank == 0:
                spread = " ".join(f"{t * 1e6:.0f}" for t in ts)
                print(f"  {size:>12} {name:>16} {med * 1e6:>10.1f} {algbw:>8.2f} {busbw:>8.2f}  [{spread}]", flush=True)
        del x
        torch.cuda.empty_cache()
    if rank == 0:
        ratios = {}
        for size in sizes:
            by = {r["peer"]: r["median_s"] for r in rows if r["bytes"] == size}
            if "gradwire-ipc" in by:
                ratios[size] = {k: by[k] / by["gradwire-ipc"] for k in by if k != "gradwire-ipc"}
                print(f"# {size:>12}: " + ", ".join(f"{v:.2f}x {k}" for k, v in ratios[size].items()), flush=True)
        big = [r for r in rows if r["bytes"] == 1 << 30 and r["peer"] == "gradwire-ipc"]
        ceiling = None
        if big:
            # The fan kernel reads every rank's input once and writes every
            # rank's output once: 2 * n * bytes, the least any algorithm moves.
            moved = 2 * n * (1 << 30)
            ceiling = moved / copy_bw
            print(f"# 1 GiB: {big[0]['median_s'] * 1e3:.2f} ms; kernels' bytes {moved / 2**30:.0f} GiB at the copy "
                  f"bandwidth: {ceiling * 1e3:.2f} ms -> {big[0]['median_s'] / ceiling:.2f}x the ceiling", flush=True)
        with open(out, "w") as f:
            json.dump({"ranks": n, "copy_GBps": copy_bw / 1e9, "rows": rows,
                       "ceiling_1GiB_s": ceiling}, f, indent=1)
    dist.destroy_process_group()


def bench_persistent(out):
    """Persistent (gwStart + gwWait) against the ordinary call, same buffers."""
    rounds = int(os.environ.get("GW_BENCH_ROUNDS", "5"))
    rows = []
    for size in (64 << 10, 1 << 20):
        count = size // 4
        x = torch.ones(count, device=dev)
        req = ctypes.c_void_p()
        call("gwAllReduceInit", x.data_ptr(), x.data_ptr(), count, 5, 0, H, ctypes.byref(req))

        def persistent():
            call("gwStart", req)
            call("gwWait", req, 10000)

        def ordinary():
            call("gwAllReduce", x.data_ptr(), x.data_ptr(), count, 5, 0, H)

        times = {"ordinary": [], "persistent": []}
        for _ in range(rounds):
            times["ordinary"].append(timed(ordinary, budget=0.15))
            times["persistent"].append(timed(persistent, budget=0.15))
        call("gwRequestFree", req)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"bytes": size, "ranks": n, "rounds_s": times, "median_s": med,
                     "speedup": med["ordinary"] / med["persistent"]})
        if rank == 0:
            spread = {k: " ".join(f"{t * 1e6:.1f}" for t in v) for k, v in times.items()}
            print(f"# persistent {size:>8} B: ordinary {med['ordinary'] * 1e6:.1f} us [{spread['ordinary']}], "
                  f"persistent {med['persistent'] * 1e6:.1f} us [{spread['persistent']}] -> "
                  f"{med['ordinary'] / med['persistent']:.2f}x", flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


def profile():
    """Where the IPC all-reduce's time goes (GW_CUDA_PROFILE's lines)."""
    os.environ["GW_CUDA_PROFILE"] = "1"
    for size in (1 << 20, 64 << 20):
        x = torch.ones(size // 4, device=dev)
        for _ in range(400):
            call("gwAllReduce", x.data_ptr(), x.data_ptr(), x.numel(), 5, 0, H)
        if rank == 0:
            print(f"# profile above: {size} bytes", file=sys.stderr, flush=True)
    os.environ.pop("GW_CUDA_PROFILE")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    if mode == "profile":
        profile()
        comm.destroy()
        return
    if mode == "persistent":
        bench_persistent(sys.argv[2])
        comm.destroy()
        return
    if mode == "check":
        staged = os.environ.get("GW_CUDA_IPC") == "0"
        if os.environ.get("GW_CHECK_BIG") == "1":
            check_big()
        else:
            check_all_reduce(staged)
            check_others()
            check_stream_order()
            check_persistent()
            check_python_api()
            check_errors()
        failed = sum(1 for _, ok in results if not ok)
        print(f"RESULT rank {rank}: {len(results) - failed} passed, {failed} failed", flush=True)
        comm.destroy()
        sys.exit(1 if failed else 0)
    bench(sys.argv[2])
    comm.destroy()


if __name__ == "__main__":
    main()
