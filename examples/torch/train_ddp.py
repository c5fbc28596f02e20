"""DDP on gradwire: a small CNN on scikit-learn's digits (8x8 images, 10
classes), each rank training on its slice of every global batch.

    gwrun -n 4 python examples/torch/train_ddp.py
    torchrun --nproc-per-node 4 examples/torch/train_ddp.py
    gwrun -n 4 python examples/torch/train_ddp.py --backend gloo      # the same on Gloo
    gwrun -n 2 python examples/torch/train_ddp.py --uneven            # local batches 3:1, weighted hook
    gwjob submit --workers 2 --global-batch 64 -- python3 examples/torch/train_ddp.py --steps 40

Every run starts from the same seed and sees the same global batches, so
the final parameters do not depend on the backend or on how the global
batch is split: rank 0 also trains the same model in one process on the
whole global batch and prints the largest difference (`--check`, default
on). With --uneven, rank i's local batch is proportional to i+1 (OptPerf
would choose it from the ranks' speeds) and gradwire.torch.hooks'
weighted all-reduce weights each rank's mean gradient by its share.
--save FILE writes rank 0's final parameters (torch.save) for comparison.

Started by a gwjob agent, the job server's step plan decides: each step's
global batch, this rank's local batch and offset in it (OptPerf fits them
to the ranks' measured speeds) and its gradient weight, which
hooks.StepPlan hands to the weighted hook; each step's times go back to the
server. --slow-rank R --slow-ms-per-sample MS makes rank R that much slower
per sample (a slower device), so that OptPerf gives it less.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    ).double()


def data():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float64).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    return x, y


def splits(batch, n, uneven):
    """Local batch sizes summing to `batch`: equal, or proportional to rank+1."""
    if not uneven:
        base = [batch // n] * n
        for i in range(batch - sum(base)):
            base[i] += 1
        return base
    w = [i + 1 for i in range(n)]
    sizes = [batch * wi // sum(w) for wi in w]
    sizes[-1] += batch - sum(sizes)
    return sizes


def train(net, x, y, batches, sizes, rank, lr):
    """SGD on the global batches of sizes `batches` (one per step), this rank's
    slice of each given by `sizes` (local batch sizes of the ranks)."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    lo = sum(sizes[:rank])
    for batch in batches:
        idx = torch.randint(0, len(x), (batch,), generator=g)
        sgd_step(net, opt, x, y, idx[lo:lo + sizes[rank]])
    return net


def sgd_step(net, opt, x, y, mine):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(x[mine]), y[mine])
    loss.backward()
    opt.step()


def train_planned(net, x, y, plan, steps, lr, slow_s_per_sample):
    """Up to `steps` steps as the job server plans them (hooks.StepPlan);
    returns the global batch sizes and this rank's local batches, per step."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    batches, mine = [], []
    for _ in range(steps):
        s = plan.begin()
        idx = torch.randint(0, len(x), (s.global_batch,), generator=g)
        if slow_s_per_sample:
            time.sleep(slow_s_per_sample * s.local_batch)
        sgd_step(net, opt, x, y, idx[s.offset:s.offset + s.local_batch])
        batches.append(s.global_batch)
        mine.append(s.local_batch)
        if plan.end():  # the step's compute and communication times go to the server
            break
    return batches, mine


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="gradwire")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--uneven", action="store_true")
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--save")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms-per-sample", type=float, default=0.0)
    a = p.parse_args()

    planned = bool(os.environ.get("GW_JOB_SERVER"))  # set only by a gwjob agent
    if (a.uneven or planned) and a.backend != "gradwire":
        sys.exit("--uneven and gwjob's plans use gradwire.torch.hooks: run with --backend gradwire")
    if a.backend == "gradwire":
        import gradwire.torch  # noqa: F401  (registers the backend)
        from gradwire.torch import hooks, job
    if planned:
        # Started by a gwjob agent: the job server plans every step.
        comm = job.init_process_group(a.backend)
    else:
        dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    x, y = data()
    sizes = splits(a.batch, n, a.uneven)
    slow = a.slow_ms_per_sample / 1e3 if rank == a.slow_rank else 0.0

    ddp = DDP(model())
    t0 = time.perf_counter()
    if planned:
        plan = hooks.StepPlan(comm)
        ddp.register_comm_hook(plan, hooks.weighted_allreduce_hook)
        batches, local = train_planned(ddp, x, y, plan, a.steps, a.lr, slow)
        print(f"rank {rank} local batches {local}", flush=True)
    else:
        if a.uneven:
            ddp.register_comm_hook(hooks.BatchShare(sizes[rank]), hooks.weighted_allreduce_hook)
        batches = [a.batch] * a.steps
        train(ddp, x, y, batches, sizes, rank, a.lr)
    elapsed = time.perf_counter() - t0
    params = [q.detach().clone() for q in ddp.module.parameters()]

    if rank == 0:
        shown = "planned by the job server" if planned else str(sizes)
        print(f"{a.backend}: {n} ranks, local batches {shown}, {len(batches)} steps in {elapsed:.2f} s")
        if a.check:
            # The same global batches in one process: DDP's average of the
            # ranks' mean gradients equals the global batch's mean gradient
            # only for equal slices, or for uneven ones with the weighted hook.
            ref = train(model(), x, y, batches, [max(batches)], 0, a.lr)
            diff = max((p - q).abs().max().item() for p, q in zip(params, ref.parameters()))
            print(f"largest difference from one process on the global batch: {diff:.3e}")
            if diff > 1e-5:
                sys.exit(f"parameters differ from single-process training by {diff:.3e}")
        if a.save:
            torch.save(params, a.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
