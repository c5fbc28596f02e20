"""Rank program of test_api.py: `gwrun -n N python worker.py SCENARIO`; every
rank checks its results and prints "OK <scenario>" at the end."""

import gc
import sys
import threading
import time

import numpy as np

import gradwire

FLOATS = [np.dtype(n) for n in ("float16", "float32", "float64")]


def data(rank, n, dtype):
    """Small exact values per rank: products and sums stay representable."""
    base = (np.arange(n) % 3 + 1 + rank % 2).astype(np.float64)
    if np.dtype(dtype).kind == "f":
        base = base / 2  # non-integers, still exact in float16
    return base.astype(dtype)


def expect(op, arrays):
    a = np.stack([x.astype(np.float64) for x in arrays])
    return {"sum": a.sum(0), "prod": a.prod(0), "min": a.min(0), "max": a.max(0), "avg": a.mean(0)}[op]


def ops(c):
    R, N = c.rank, c.size
    assert 0 <= R < N and N >= 2
    n = 5 * N
    for dt in gradwire.DTYPES:
        all_ = [data(r, n, dt) for r in range(N)]
        mine = all_[R]
        for op in gradwire.OPS:
            if op == "avg" and dt.kind != "f":
                continue
            got = c.allreduce(mine, op=op)
            assert got.dtype == dt and got.shape == mine.shape, (dt, op, got.dtype)
            np.testing.assert_allclose(got.astype(np.float64), expect(op, all_), rtol=1e-3, err_msg=f"{dt} {op}")
            rs = c.reduce_scatter(mine, op=op)
            assert rs.shape == (n // N,)
            np.testing.assert_allclose(rs.astype(np.float64), expect(op, all_)[R * 5:(R + 1) * 5], rtol=1e-3)
        ag = c.allgather(mine)
        assert ag.shape == (N, n) and ag.dtype == dt
        np.testing.assert_array_equal(ag, np.stack(all_))
        for root in range(N):
            b = c.broadcast(mine, root=root)
            np.testing.assert_array_equal(b, all_[root])
            red = c.reduce(mine, op="sum", root=root)
            if R == root:
                np.testing.assert_allclose(red.astype(np.float64), expect("sum", all_), rtol=1e-3)
            else:
                assert red is None
        c.barrier()

    # 2-D arrays keep their shape; reduce_scatter splits the first axis.
    m = np.full((N * 2, 3), R + 1, np.float32)
    s = c.reduce_scatter(m)
    assert s.shape == (2, 3) and (s == N * (N + 1) / 2).all()
    assert c.allgather(m).shape == (N, N * 2, 3)
    # In place: out is the input.
    x = np.ones(7, np.float64)
    y = c.allreduce(x, out=x)
    assert y is x and (x == N).all()
    # Non-contiguous input is copied, input untouched.
    big = np.arange(20, dtype=np.int64)
    got = c.allreduce(big[::2])
    assert (got == big[::2] * N).all() and (big == np.arange(20)).all()
    # Scalars and lists go through np.asarray.
    assert c.allreduce([1.0, 2.0]).tolist() == [N, 2.0 * N]
    # Weighted all-reduce: sum of w_r * x_r.
    for dt in FLOATS:
        w = (R + 1) / (N * (N + 1) / 2)
        got = c.allreduce(np.full(9, R + 1, dt), weight=w)
        want = sum((r + 1) * (r + 1) / (N * (N + 1) / 2) for r in range(N))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2 if dt == np.float16 else 1e-6)
    # Argument errors raised in Python before any communication.
    for bad, exc in ((lambda: c.allreduce(np.ones(3, np.complex64)), TypeError),
                     (lambda: c.allreduce(np.ones(3, bool)), TypeError),
                     (lambda: c.allreduce(np.ones(3), op="median"), ValueError),
                     (lambda: c.allreduce(np.ones(3), op="max", weight=0.5), ValueError),
                     (lambda: c.allreduce(np.ones(4), out=np.ones(8)[::2]), ValueError),
                     (lambda: c.allreduce(np.ones(4), out=np.ones(4, np.float32)), TypeError),
                     (lambda: c.allreduce(np.ones(4), out=np.ones(5)), ValueError),
                     (lambda: c.reduce_scatter(np.ones(N + 1)), ValueError)):
        try:
            bad()
        except exc as e:
            assert "gradwire" in str(e)
        else:
            raise AssertionError("no error")
    c.barrier()


def async_(c):
    R, N = c.rank, c.size
    x = np.arange(1000, dtype=np.float32) + R
    req = c.allreduce_async(x)
    del x  # the request keeps the arrays alive
    gc.collect()
    while not req.test():
        time.sleep(0.001)
    got = req.wait()
    np.testing.assert_array_equal(got, np.arange(1000) * N + N * (N - 1) / 2)
    assert req.wait() is got  # idempotent after completion
    reqs = [c.allreduce_async(np.ones(10), weight=0.5),
            c.reduce_scatter_async(np.ones(3 * N, np.int32)),
            c.allgather_async(np.full(2, R, np.int64)),
            c.broadcast_async(np.full(4, R, np.uint8), root=N - 1),
            c.barrier_async()]
    w, rs, ag, bc, bar = [r.wait(timeout_ms=20000) for r in reqs]
    assert (w == 0.5 * N).all() and (rs == N).all() and rs.shape == (3,)
    assert ag.tolist() == [[r, r] for r in range(N)]
    assert (bc == N - 1).all() and bar is None
    # A wait with a deadline that passes raises gradwire.TimeoutError; the request stays valid.
    if R == 0:
        req = c.allreduce_async(np.ones(4))
        try:
            req.wait(timeout_ms=50)
        except gradwire.TimeoutError as e:
            assert e.code_name == "gwTimeout" and isinstance(e, TimeoutError), e
        else:
            raise AssertionError("wait did not time out while rank 1 was sleeping")
        assert (req.wait() == N).all()
    else:
        time.sleep(1.0)
        assert (c.allreduce(np.ones(4)) == N).all()
    # destroy() waits for requests nobody waited for.
    c.allreduce_async(np.ones(3))


def errors(c):
    R, N = c.rank, c.size
    cases = [
        (lambda: c.allreduce(np.ones(3, np.int32), op="avg"), "gwInvalidArgument", ("avg", "int32")),
        (lambda: c.allreduce(np.ones(3, np.int64), weight=0.5), "gwInvalidArgument", ("int64",)),
        (lambda: c.broadcast(np.ones(3), root=N), "gwInvalidArgument", ("root",)),
        (lambda: c.reduce(np.ones(3), root=-1), "gwInvalidArgument", ("root",)),
    ]
    for call, code, words in cases:
        try:
            call()
        except gradwire.GradwireError as e:
            assert e.code_name == code, e
            assert type(e) is gradwire.error_class(code) and isinstance(e, gradwire.InvalidArgumentError)
            assert e.code == gradwire.Result.InvalidArgument
            assert all(w in e.message for w in words), e.message
            assert e.message in str(e) and code in str(e)
        else:
            raise AssertionError(f"no error for {code} {words}")
    # The communicator is still usable after argument errors.
    assert (c.allreduce(np.ones(2)) == N).all()
    c.barrier()


def abort(c):
    """Rank 0 blocks in an all-reduce rank 1 never joins; another thread aborts it."""
    R = c.rank
    c.barrier()  # both ranks are here: rank 1 outlives the abort by a wide margin
    if R == 0:
        t = threading.Timer(0.3, c.abort)
        t.start()
        t0 = time.monotonic()
        try:
            c.allreduce(np.ones(1000))
        except gradwire.AbortedError as e:
            assert e.code_name == "gwAborted" and e.message, e
        else:
            raise AssertionError("all-reduce was not aborted")
        assert time.monotonic() - t0 < 10
        try:
            c.barrier()
        except gradwire.AbortedError:
            pass
        else:
            raise AssertionError("barrier after abort succeeded")
    else:
        time.sleep(5.0)  # alive (not in any call) while rank 0 is blocked and aborted
    c.destroy()
    try:
        c.barrier()
    except gradwire.InvalidUsageError as e:
        assert "destroyed" in e.message
    else:
        raise AssertionError("use after destroy succeeded")
    c.destroy()  # idempotent


def persistent(c):
    """allreduce_init: one request per case, 20 rounds with new inputs each, checked exactly."""
    R, N = c.rank, c.size

    def inp(r, k, n):
        return (np.arange(n) * 3 + r * 7 + k * 5) % 5

    def want(k, n, op):
        a = np.stack([inp(r, k, n) for r in range(N)])
        return a.sum(0) if op == "sum" else a.max(0)

    for dt, n, op, in_place in ((np.float32, 4099, "sum", True), (np.float64, 7, "sum", False),
                                (np.int32, 1, "max", True), (np.int64, 1000, "max", False)):
        x = np.zeros(n, dt)
        out = None if in_place else np.zeros(n, dt)
        with c.allreduce_init(x, op=op, out=out) as req:
            assert req.test()  # nothing started: complete
            assert req.array is (x if in_place else out)
            for k in range(20):
                x[:] = inp(R, k, n)
                req.start()
                if k % 2:
                    while not req.test():
                        time.sleep(0.0005)
                    got = req.array
                else:
                    got = req.wait(timeout_ms=20000)
                assert got is req.array
                np.testing.assert_array_equal(got, want(k, n, op).astype(dt), err_msg=f"{dt} {op} round {k}")
                if not in_place:
                    np.testing.assert_array_equal(x, inp(R, k, n).astype(dt))
                c.barrier()  # ordinary calls between rounds
        try:
            req.start()
        except gradwire.InvalidUsageError as e:
            assert "freed" in e.message
        else:
            raise AssertionError("start after free succeeded")
        req.free()  # idempotent

    # Start while running (the other ranks start late): InvalidUsageError; free waits.
    y = np.ones(100, np.float32)
    req = c.allreduce_init(y)
    if R == 0:
        req.start()
        try:
            req.start()
        except gradwire.InvalidUsageError as e:
            assert "still running" in e.message, e.message
        else:
            raise AssertionError("second start succeeded")
        try:
            req.wait(timeout_ms=10)
        except gradwire.TimeoutError:
            pass
        else:
            raise AssertionError("round finished before the other ranks started")
        req.free()  # waits for the round
    else:
        time.sleep(0.3)
        req.start()
        req.wait()
        req.free()
    assert (y == N).all(), y[:4]
    # Unreferenced requests are freed by the garbage collector; destroy frees the rest.
    z = np.ones(3, np.float64)
    c.allreduce_init(z)
    gc.collect()
    keep = c.allreduce_init(np.ones(5, np.int32)).start()
    keep.wait()
    # Arguments are checked before anything is planned.
    for bad, exc in ((lambda: c.allreduce_init([1.0, 2.0]), TypeError),
                     (lambda: c.allreduce_init(np.ones(8)[::2]), ValueError),
                     (lambda: c.allreduce_init(np.ones(3, bool)), TypeError),
                     (lambda: c.allreduce_init(np.ones(3), op="median"), ValueError),
                     (lambda: c.allreduce_init(np.ones(4), out=np.ones(4, np.float32)), TypeError),
                     (lambda: c.allreduce_init(np.ones(4), out=np.ones(5)), ValueError)):
        try:
            bad()
        except exc as e:
            assert "gradwire" in str(e)
        else:
            raise AssertionError("no error")
    c.barrier()


def register(c):
    """Comm.register: calls on views of a registered array are right; deregister
    (idempotent) waits for an earlier call; misuse raises with the reason."""
    R, N = c.rank, c.size
    buf = np.zeros(1 << 20, np.float32)
    with c.register(buf) as reg:
        assert reg.array is buf
        for k in range(8):
            n = 1000 + k * 30011
            src, dst = buf[k * 977:k * 977 + n], buf[500000 + k * 331:500000 + k * 331 + n]
            src[:] = (np.arange(n) * 3 + R * 7 + k) % 11
            want = sum((np.arange(n) * 3 + r * 7 + k) % 11 for r in range(N)).astype(np.float32)
            c.allreduce(src, out=dst)
            assert np.array_equal(dst, want), f"round {k}"
            c.allreduce(src, out=src)
            assert np.array_equal(src, want), f"round {k} in place"
        buf[:5000] = 1
        req = c.allreduce_async(buf[:5000], out=buf[:5000])
        reg.deregister()
        req.wait()
        assert np.all(buf[:5000] == N)
        reg.deregister()  # idempotent
    for bad in (buf[::2], [1.0, 2.0]):
        try:
            c.register(bad)
        except (TypeError, ValueError) as e:
            assert "gradwire: register" in str(e)
        else:
            raise AssertionError("registered a bad array")
    try:
        c.register(np.zeros(0, np.float32))
    except gradwire.InvalidArgumentError as e:
        assert "at least one byte" in e.message, e.message
    else:
        raise AssertionError("registered an empty array")
    kept = c.register(np.ones(16, np.float32))  # withdrawn by destroy
    assert repr(kept) == "<gradwire.Registration registered>"
    c.barrier()


def trace(c):
    """Compute reported with gradwire.trace_span lands in GW_TRACE's file
    (read back by test_trace.py); bad names and durations are refused."""
    import time

    with gradwire.trace_span("forward", step=7):
        time.sleep(0.02)
    x = np.ones(4, np.float32)
    c.allreduce(x, out=x)
    for bad in ["", 'a"b', "x" * 65]:
        try:
            with gradwire.trace_span(bad):
                pass
        except gradwire.InvalidArgumentError as e:
            assert "trace span name" in e.message, e.message
        else:
            raise AssertionError(f"trace_span({bad!r}) was accepted")


def main():
    scenario = sys.argv[1]
    c = gradwire.init()
    if scenario == "abort":
        abort(c)
    else:
        with c:
            {"ops": ops, "async": async_, "errors": errors, "persistent": persistent,
             "register": register, "trace": trace}[scenario](c)
    print(f"OK {scenario}", flush=True)


if __name__ == "__main__":
    main()
