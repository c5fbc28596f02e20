"""One rank of the PyTorch backend tests (test_torch.py), started by gwrun
or torchrun: `python torch_worker.py SCENARIO`. Prints "OK SCENARIO"."""

import os
import sys

import torch
import torch.distributed as dist

import gradwire
import gradwire.torch  # noqa: F401  (registers "gradwire")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]


def val(r, i, dtype):
    """Small integers: exact in every dtype, sums of 4 ranks included."""
    return torch.tensor([(r * 3 + j) % 5 + 1 for j in range(i)]).to(dtype)


def same(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: got {got.tolist()}, want {want.tolist()}")


def collectives():
    r, n = dist.get_rank(), dist.get_world_size()
    R = dist.ReduceOp
    for dt in DTYPES:
        for count in (1, 7, 1000):
            ins = [val(q, count, dt) for q in range(n)]
            stack = torch.stack([t.double() for t in ins])
            ops = [(R.SUM, stack.sum(0)), (R.MIN, stack.min(0).values), (R.MAX, stack.max(0).values)]
            if dt != torch.uint8 or n <= 2:
                ops.append((R.PRODUCT, stack.prod(0)))
            if dt.is_floating_point:
                ops.append((R.AVG, stack.sum(0) / n))
            for op, want in ops:
                x = ins[r].clone()
                dist.all_reduce(x, op=op)
                same(x, want.to(dt), f"all_reduce {op} {dt} x{count}")
            # Non-contiguous: every other element of a wider tensor.
            wide = torch.zeros(count * 2, dtype=dt)
            wide[::2] = ins[r]
            view = wide[::2]
            dist.all_reduce(view)
            same(view, stack.sum(0).to(dt), f"all_reduce non-contiguous {dt}")
            same(wide[1::2], torch.zeros(count, dtype=dt), "the elements between untouched")
            # broadcast from the last rank
            b = ins[r].clone()
            dist.broadcast(b, src=n - 1)
            same(b, ins[n - 1], f"broadcast {dt}")
            # all_gather, both forms
            outs = [torch.empty(count, dtype=dt) for _ in range(n)]
            dist.all_gather(outs, ins[r])
            for q in range(n):
                same(outs[q], ins[q], f"all_gather {dt} from {q}")
            flat = torch.empty(count * n, dtype=dt)
            dist.all_gather_into_tensor(flat, ins[r])
            same(flat, torch.cat(ins), f"all_gather_into_tensor {dt}")
            # reduce_scatter, both forms: rank q's input for block p is val(q, ...) shifted by p
            blocks = [[val(q + p, count, dt) for p in range(n)] for q in range(n)]
            out = torch.empty(count, dtype=dt)
            dist.reduce_scatter(out, blocks[r])
            want = torch.stack([blocks[q][r].double() for q in range(n)]).sum(0).to(dt)
            same(out, want, f"reduce_scatter {dt}")
            out2 = torch.empty(count, dtype=dt)
            dist.reduce_scatter_tensor(out2, torch.cat(blocks[r]))
            same(out2, want, f"reduce_scatter_tensor {dt}")
            # reduce to rank 0
            x = ins[r].clone()
            dist.reduce(x, dst=0)
            if r == 0:
                same(x, stack.sum(0).to(dt), f"reduce {dt}")
            # gather and scatter with root 1 % n
            root = 1 % n
            g = [torch.empty(count, dtype=dt) for _ in range(n)] if r == root else None
            dist.gather(ins[r], g, dst=root)
            if r == root:
                for q in range(n):
                    same(g[q], ins[q], f"gather {dt} from {q}")
            s = torch.empty(count, dtype=dt)
            dist.scatter(s, [val(10 + q, count, dt) for q in range(n)] if r == root else None, src=root)
            same(s, val(10 + r, count, dt), f"scatter {dt}")
    # all_to_all_single, equal and uneven splits (rank p sends rank q p+q+1
    # rows of 2), and the list form.
    for dt in (torch.float32, torch.int64, torch.bfloat16):
        inp = torch.cat([val(r * 10 + q, 4, dt) for q in range(n)])
        out = torch.empty(4 * n, dtype=dt)
        dist.all_to_all_single(out, inp)
        same(out, torch.cat([val(q * 10 + r, 4, dt) for q in range(n)]), f"all_to_all_single {dt}")
    rows = lambda p, q: p + q + 1  # noqa: E731
    inp = torch.cat([torch.full((rows(r, q), 2), float(r * 100 + q)) for q in range(n)])
    out = torch.empty(sum(rows(q, r) for q in range(n)), 2)
    dist.all_to_all_single(out, inp, [rows(q, r) for q in range(n)], [rows(r, q) for q in range(n)])
    same(out, torch.cat([torch.full((rows(q, r), 2), float(q * 100 + r)) for q in range(n)]), "all_to_all_single uneven")
    outs = [torch.empty(3, dtype=torch.int32) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((3,), r * 10 + q, dtype=torch.int32) for q in range(n)])
    for q in range(n):
        same(outs[q], torch.full((3,), q * 10 + r, dtype=torch.int32), f"all_to_all from {q}")
    # PREMUL_SUM: sum of factor * x
    x = torch.full((5,), float(r + 1))
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    same(x, torch.full((5,), 0.5 * n * (n + 1) / 2), "premul_sum")
    # bool: MAX is or, MIN is and
    flag = torch.tensor([r == 0, True, False])
    dist.all_reduce(flag, op=R.MAX)
    same(flag, torch.tensor([True, True, False]), "bool max")
    flag = torch.tensor([r == 0, True, False])
    dist.all_reduce(flag, op=R.MIN)
    same(flag, torch.tensor([n == 1, True, False]), "bool min")
    # Async form: the Work is complete, with a future holding the tensors.
    t = torch.ones(3)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait()
    fut = w.get_future()
    fut.wait()
    same(t, torch.full((3,), float(n)), "async all_reduce")
    dist.barrier()


def errors():
    r = dist.get_rank()

    def raises(kind, needle, f):
        try:
            f()
        except kind as e:
            if needle not in str(e):
                raise AssertionError(f"{kind.__name__} without {needle!r}: {e}")
            return
        raise AssertionError(f"no {kind.__name__} ({needle})")

    raises(TypeError, "int8", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int8)))
    raises(TypeError, "bool", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)))
    raises(TypeError, "AVG", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG))
    # A CUDA tensor (none can be made here): the backend's own check.
    import types

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    fake = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.float32)
    raises(ValueError, "cpu:gradwire,cuda:nccl", lambda: backend._dtype(fake, None, "all_reduce"))
    raises(ValueError, "tag", lambda: dist.send(torch.ones(1), dst=(r + 1) % dist.get_world_size(), tag=3))
    odd = 2 * dist.get_world_size() + 1
    raises(ValueError, "equal parts", lambda: dist.all_to_all_single(torch.empty(odd), torch.ones(odd)))
    dist.barrier()
    # Ranks that disagree about a size: gradwire's error on every rank, no hang.
    try:
        dist.all_reduce(torch.ones(10 + r))
    except Exception as e:  # gradwire's error class, through the trampoline
        print(f"mismatch raised: {type(e).__name__}: {str(e)[:200]}", flush=True)
    else:
        raise AssertionError("mismatched sizes did not raise")


def p2p():
    """send/recv and isend/irecv between neighbours, every element checked."""
    r, n = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % n, (r - 1) % n
    for count in (1, 1000, 1 << 20):
        mine = torch.arange(count, dtype=torch.float32) + r * 10
        got = torch.empty(count)
        # Blocking calls, as with MPI_Send: a large send returns once its
        # receive has it, so even ranks send first and odd ones receive first.
        if r % 2 == 0:
            dist.send(mine, right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(mine, right)
        same(got, torch.arange(count, dtype=torch.float32) + left * 10, f"send/recv x{count}")
    if n % 2 == 0:
        buf = torch.empty(5, dtype=torch.int64)
        reqs = [dist.irecv(buf, left), dist.isend(torch.full((5,), r, dtype=torch.int64), right)] if r % 2 else [
            dist.isend(torch.full((5,), r, dtype=torch.int64), right), dist.irecv(buf, left)]
        for q in reqs:
            q.wait()
        same(buf, torch.full((5,), left, dtype=torch.int64), "isend/irecv")
    # Every rank posts its large send before its receive (MPI code swapping
    # buffers does): the receive must not wait behind the rank's own send.
    big = 1 << 20
    got = torch.empty(big)
    reqs = [dist.isend(torch.arange(big, dtype=torch.float32) + r, right), dist.irecv(got, left)]
    for q in reqs:
        q.wait()
    same(got, torch.arange(big, dtype=torch.float32) + left, f"isend then irecv x{big}")


def killed():
    """The last rank dies mid-job; every other rank's next collective
    raises gradwire's error naming it, well within GW_TIMEOUT."""
    import time

    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.ones(4)
    dist.all_reduce(x)
    if r == n - 1:
        os._exit(0)  # no goodbye: as a crash
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16))
    except Exception as e:
        print(f"raised after {time.monotonic() - t0:.1f} s: {type(e).__name__}: {str(e)[:300]}", flush=True)
        os._exit(0)
    raise AssertionError("an all_reduce with a dead rank returned")


def store():
    """init_process_group with an explicit store (a TCPStore rank 0 hosts)."""
    r, n = int(os.environ["GW_RANK"]), int(os.environ["GW_WORLD_SIZE"])
    host, port = "127.0.0.1", int(os.environ["MASTER_PORT"])
    st = dist.TCPStore(host, port, n, is_master=(r == 0))
    dist.init_process_group("gradwire", store=st, rank=r, world_size=n)
    x = torch.full((3,), float(r))
    dist.all_reduce(x)
    same(x, torch.full((3,), float(n * (n - 1) / 2)), "all_reduce over an explicit store")


def fsdp():
    """FSDP2 (fully_shard) on CPU over gradwire equals one process on the global batch."""
    from torch.distributed.fsdp import fully_shard

    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).double()
    ref, net = make(), make()
    net.load_state_dict(ref.state_dict())
    fully_shard(net)
    opt, ropt = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        x, y = torch.randn(8 * n, 16, generator=g, dtype=torch.float64), torch.randn(8 * n, 4, generator=g, dtype=torch.float64)
        mine = slice(8 * r, 8 * (r + 1))
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[mine]), y[mine]).backward()
        opt.step()
        ropt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ropt.step()
    full = {k: v.full_tensor() for k, v in net.state_dict().items()}
    for k, v in ref.state_dict().items():
        d = (full[k] - v).abs().max().item()
        if d > 1e-10:
            raise AssertionError(f"FSDP parameter {k} differs from one process by {d}")


def main():
    scenario = sys.argv[1]
    if scenario != "store":
        dist.init_process_group("gradwire")
    {"collectives": collectives, "errors": errors, "store": store, "fsdp": fsdp, "p2p": p2p,
     "killed": killed}[scenario]()
    if scenario != "errors":  # a failed collective leaves the group unusable
        dist.destroy_process_group()
    print(f"OK {scenario}", flush=True)


if __name__ == "__main__":
    main()
