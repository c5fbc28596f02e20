#!/usr/bin/env python3
"""Data-parallel training of a small MLP (numpy only) on scikit-learn's digits,
gradients combined with gradwire's weighted all-reduce.

  gwrun -n 4 python examples/python/train_digits.py --steps 300 --global-batch 128 --save dp.npz
  gwrun -n 4 python examples/python/train_digits.py --local-batches 48,32,16,32 --save uneven.npz
  python examples/python/train_digits.py --single --save single.npz     # same global batches, no gradwire

Every step all ranks draw the same global batch (a seeded shuffle of the
training set); rank i takes its slice of b_i samples and computes the mean
gradient over it; the global gradient is sum_i (b_i / B) * g_i, computed by
gradwire's weighted all-reduce in float64, i.e. exactly the mean gradient over
the global batch, whatever the split. --single computes that mean directly.
"""

import argparse
import os
import sys

import numpy as np
from sklearn.datasets import load_digits


def load_data(seed):
    X, y = load_digits(return_X_y=True)
    X = X.astype(np.float64) / 16.0
    perm = np.random.default_rng(seed).permutation(len(X))
    n_test = len(X) // 5
    test, train = perm[:n_test], perm[n_test:]
    return X[train], y[train], X[test], y[test]


class MLP:
    """in -> hidden (tanh) -> classes (softmax); parameters live in one flat float64 vector."""

    def __init__(self, n_in, n_hidden, n_out, seed):
        self.shapes = [("W1", (n_in, n_hidden)), ("b1", (n_hidden,)), ("W2", (n_hidden, n_out)), ("b2", (n_out,))]
        self.size = sum(int(np.prod(s)) for _, s in self.shapes)
        self.flat = np.zeros(self.size)
        self.p = self._views(self.flat)
        rng = np.random.default_rng(seed)
        self.p["W1"][...] = rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_hidden))
        self.p["W2"][...] = rng.normal(0, 1 / np.sqrt(n_hidden), (n_hidden, n_out))

    def _views(self, flat):
        out, off = {}, 0
        for name, shape in self.shapes:
            n = int(np.prod(shape))
            out[name] = flat[off:off + n].reshape(shape)
            off += n
        return out

    def forward(self, X):
        h = np.tanh(X @ self.p["W1"] + self.p["b1"])
        z = h @ self.p["W2"] + self.p["b2"]
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return h, e / e.sum(axis=1, keepdims=True)

    def grad(self, X, y):
        """Mean cross-entropy gradient over (X, y) as a flat vector (zeros if empty)."""
        g = np.zeros(self.size)
        if len(X) == 0:
            return g
        gv = self._views(g)
        h, prob = self.forward(X)
        dz = prob
        dz[np.arange(len(y)), y] -= 1.0
        dz /= len(y)
        gv["W2"][...] = h.T @ dz
        gv["b2"][...] = dz.sum(axis=0)
        dh = (dz @ self.p["W2"].T) * (1.0 - h * h)
        gv["W1"][...] = X.T @ dh
        gv["b1"][...] = dh.sum(axis=0)
        return g

    def accuracy(self, X, y):
        return float((self.forward(X)[1].argmax(axis=1) == y).mean())


def global_batches(n_train, batch, steps, seed):
    """The same sequence of global batches (index arrays) on every rank: seeded epoch shuffles."""
    rng = np.random.default_rng(seed + 1)
    order = np.empty(0, dtype=np.int64)
    for _ in range(steps):
        if len(order) < batch:
            order = np.concatenate([order, rng.permutation(n_train)])
        yield order[:batch]
        order = order[batch:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--local-batches", help="comma-separated per-rank batch sizes summing to --global-batch")
    ap.add_argument("--single", action="store_true", help="one process, no gradwire")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write the final parameters to this .npz (rank 0)")
    args = ap.parse_args()

    Xtr, ytr, Xte, yte = load_data(args.seed)
    model = MLP(Xtr.shape[1], args.hidden, 10, args.seed)
    B = args.global_batch

    comm = None
    rank, size = 0, 1
    if not args.single:
        import gradwire

        comm = gradwire.init()
        rank, size = comm.rank, comm.size
    if args.local_batches:
        local = [int(x) for x in args.local_batches.split(",")]
        if len(local) != size or sum(local) != B or min(local) < 0:
            sys.exit(f"--local-batches {args.local_batches}: need {size} sizes >= 0 summing to {B}")
    else:
        local = [B // size + (1 if r < B % size else 0) for r in range(size)]
    lo = sum(local[:rank])
    hi = lo + local[rank]
    weight = local[rank] / B

    if comm is not None:
        comm.broadcast(model.flat, root=0, out=model.flat)  # every rank starts from rank 0's parameters
    for idx in global_batches(len(Xtr), B, args.steps, args.seed):
        mine = idx[lo:hi]
        g = model.grad(Xtr[mine], ytr[mine])
        if comm is not None:
            comm.allreduce(g, weight=weight, out=g)  # sum_i (b_i/B) g_i: the global mean gradient
        model.flat -= args.lr * g

    if rank == 0:
        acc = model.accuracy(Xte, yte)
        mode = "single" if comm is None else f"{size} ranks, local batches {local}"
        print(f"steps {args.steps}, global batch {B} ({mode}): test accuracy {acc:.4f}", flush=True)
        if args.save:
            np.savez(args.save, flat=model.flat, accuracy=acc, **{k: v for k, v in model.p.items()})
    if comm is not None:
        comm.destroy()


if __name__ == "__main__":
    main()
