"""PyTorch's c10d backend "gradwire" for CPU tensors.

    import torch.distributed as dist
    import gradwire.torch  # registers the backend
    dist.init_process_group("gradwire")          # under gwrun or torchrun
    dist.init_process_group("cpu:gradwire,cuda:nccl")   # CPU tensors only

A pure-Python backend on torch's PyBackend trampoline (torch >= 2.10): each
collective calls gradwire's C ABI on the tensor's own memory (no copy for
contiguous tensors). The ranks of a group find each other through the
group's torch store: rank 0 makes a gradwire unique id (which starts
gradwire's rendezvous store in that process) and publishes it there, so the
backend works with every way torch initialises (env:// under torchrun or
gwrun, which sets torchrun's variables; tcp://; an explicit `store=`).

Supported: all_reduce (SUM, AVG, PRODUCT, MIN, MAX, and PREMUL_SUM as
gradwire's weighted all-reduce), broadcast, all_gather and
all_gather_into_tensor, reduce_scatter and reduce_scatter_tensor, reduce,
gather, scatter, all_to_all, all_to_all_single, barrier, send/recv (isend/irecv start at once, in any order
on either rank; tags are not supported); dtypes float32, float64,
float16, bfloat16, int32, int64, uint8, and bool (MIN/MAX only). An all_reduce asked for
asynchronously (DDP's gradient buckets) is queued with gradwire's
non-blocking call and its Work completes when gradwire finishes it, so the
reduction overlaps the rest of the backward pass; every other call runs to
completion before it returns. all_to_all and all_to_all_single (with
splits) run on gradwire's all-to-all. Not supported (TypeError): int8 and
int16.
"""

import ctypes
import queue
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10DBackend
from torch._C._distributed_c10d import ReduceOp

import gradwire as _gw
from gradwire import _C, _SUCCESS, _check, _last_error, error_class

__all__ = ["GradwireBackend", "MIN_TORCH", "hooks", "job"]

MIN_TORCH = (2, 10)


def _version(v):
    parts = []
    for p in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version(torch.__version__) < MIN_TORCH:
    raise ImportError(
        f"gradwire.torch needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (its Python backend "
        f"trampoline); this is torch {torch.__version__}"
    )

_DT = _gw.ENUMS["gwDataType_t"]
_RO = _gw.ENUMS["gwRedOp_t"]
_DTYPES = {
    torch.float32: _DT["gwFloat32"],
    torch.float64: _DT["gwFloat64"],
    torch.float16: _DT["gwFloat16"],
    torch.bfloat16: _DT["gwBfloat16"],
    torch.int32: _DT["gwInt32"],
    torch.int64: _DT["gwInt64"],
    torch.uint8: _DT["gwUint8"],
    # bool is one byte, 0 or 1: MIN is logical and, MAX logical or.
    torch.bool: _DT["gwUint8"],
}
_OPS = {
    ReduceOp.SUM: _RO["gwSum"],
    ReduceOp.AVG: _RO["gwAvg"],
    ReduceOp.PRODUCT: _RO["gwProd"],
    ReduceOp.MIN: _RO["gwMin"],
    ReduceOp.MAX: _RO["gwMax"],
}


def _op_name(op):
    return str(op).rsplit(".", 1)[-1]


class _DoneWork(dist._Work):
    """The Work of a call that already ran to completion (or raised)."""

    def __init__(self, result=None):
        super().__init__()
        self._result = result

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def result(self):
        return self._result


class _AsyncWork(dist._Work):
    """A queued gradwire request; `_Waiter` completes it."""

    def __init__(self, req, tensors, what, comm_handle):
        super().__init__()
        self._req = req
        self._tensors = tensors  # gradwire writes them until the request ends
        self._what = what
        self._comm_handle = comm_handle
        self._done = threading.Event()
        self._error = None
        self._fut = torch.futures.Future()

    def _finish(self, res):
        if res != _SUCCESS:
            self._error = error_class(res)(res, _last_error(self._comm_handle), self._what)
            self._fut.set_exception(self._error)
        else:
            self._fut.set_result(self._tensors)
        self._done.set()

    def wait(self, timeout=None):
        secs = None
        if timeout is not None:
            secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
            secs = secs if secs > 0 else None
        if not self._done.wait(secs):
            raise TimeoutError(f"gradwire backend: {self._what} did not finish in {secs} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._fut


class _Waiter:
    """One thread per backend that waits for its queued requests in order
    (gradwire finishes a communicator's operations in order) and completes
    their Works; gwWait releases the GIL while it blocks."""

    def __init__(self):
        self._q = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="gradwire-waiter", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            work = self._q.get()
            if work is None:
                return
            work._finish(_C.gwWait(work._req, -1))

    def add(self, work):
        self._q.put(work)

    def close(self):
        self._q.put(None)
        self._thread.join()


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr())


class GradwireBackend(_C10DBackend):
    """One gradwire communicator per process group (see the module comment)."""

    def __init__(self, store, rank, size, timeout, group_name="default"):
        super().__init__(rank, size)
        self._options = _C10DBackend.Options("gradwire", timeout=timeout)
        key = f"gradwire/{group_name}/unique_id"
        if rank == 0:
            store.set(key, _gw.get_unique_id())
        else:
            store.wait([key])
        uid = bytes(store.get(key))
        self._comm = _gw.init_rank(size, uid, rank)
        self._h = self._comm._handle()
        self._waiter = _Waiter()

    @property
    def options(self):
        return self._options

    def getBackendName(self):
        return "gradwire"

    # -- argument checks -------------------------------------------------

    def _dtype(self, t, op=None, what=""):
        if t.device.type != "cpu":
            raise ValueError(
                f"gradwire backend: {what} got a tensor on {t.device}; it handles CPU tensors "
                f'(use "cpu:gradwire,cuda:nccl" to send CUDA tensors elsewhere)'
            )
        code = _DTYPES.get(t.dtype)
        if code is None:
            names = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
            raise TypeError(f"gradwire backend: {what}: dtype {t.dtype} is not supported ({names})")
        if t.dtype == torch.bool and op is not None and op not in (ReduceOp.MIN, ReduceOp.MAX):
            raise TypeError(
                f"gradwire backend: {what}: {_op_name(op)} on bool tensors is not supported "
                "(MIN is logical and, MAX logical or)"
            )
        return code

    def _redop(self, reduce_op, t, what):
        """(gradwire op code, weight or None) for a c10d reduce op."""
        op = reduce_op.op if hasattr(reduce_op, "op") else reduce_op
        if op == ReduceOp.PREMUL_SUM:
            if not t.is_floating_point():
                raise TypeError(f"gradwire backend: {what}: PREMUL_SUM needs a floating-point tensor")
            factor = reduce_op.factor if hasattr(reduce_op, "factor") else None
            if isinstance(factor, torch.Tensor):
                factor = float(factor.item())
            if factor is None:
                raise ValueError(f"gradwire backend: {what}: PREMUL_SUM without a factor")
            return _RO["gwSum"], float(factor)
        code = _OPS.get(op)
        if code is None:
            raise ValueError(f"gradwire backend: {what}: reduce op {_op_name(op)} is not supported")
        if op == ReduceOp.AVG and not t.is_floating_point():
            raise TypeError(f"gradwire backend: {what}: AVG on {t.dtype} (integer averages would truncate)")
        self._dtype(t, op, what)
        return code, None

    def _call(self, fname, *args):
        _check(getattr(_C, fname)(*args), fname, self._h)

    # -- in-place helpers: contiguous views, copied back when not ----------

    @staticmethod
    def _contig(t):
        return t if t.is_contiguous() else t.contiguous()

    @staticmethod
    def _back(orig, work):
        if work is not orig:
            orig.copy_(work)

    # -- collectives ---------------------------------------------------

    def allreduce(self, tensors, opts):
        if getattr(opts, "asyncOp", False) and len(tensors) == 1 and tensors[0].is_contiguous() and tensors[0].numel():
            return self._allreduce_async(tensors[0], opts)
        for t in tensors:
            code, weight = self._redop(opts.reduceOp, t, "all_reduce")
            dt = self._dtype(t, None, "all_reduce")
            w = self._contig(t)
            if w.numel():
                if weight is None:
                    self._call("gwAllReduce", _ptr(w), _ptr(w), w.numel(), dt, code, self._h)
                else:
                    self._call("gwAllReduceWeighted", _ptr(w), _ptr(w), w.numel(), dt, ctypes.c_double(weight), self._h)
            self._back(t, w)
        return _DoneWork(tensors)

    def _allreduce_async(self, t, opts):
        code, weight = self._redop(opts.reduceOp, t, "all_reduce")
        dt = self._dtype(t, None, "all_reduce")
        req = ctypes.c_void_p()
        if weight is None:
            self._call("gwAllReduceAsync", _ptr(t), _ptr(t), t.numel(), dt, code, self._h, ctypes.byref(req))
        else:
            self._call(
                "gwAllReduceWeightedAsync", _ptr(t), _ptr(t), t.numel(), dt, ctypes.c_double(weight), self._h,
                ctypes.byref(req),
            )
        work = _AsyncWork(req, [t], "all_reduce", self._h)
        self._waiter.add(work)
        return work

    def allreduce_coalesced(self, tensors, opts):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        for t in tensors:
            dt = self._dtype(t, None, "broadcast")
            w = self._contig(t)
            if w.numel():
                self._call("gwBroadcast", _ptr(w), _ptr(w), w.numel(), dt, int(opts.rootRank), self._h)
            self._back(t, w)
        return _DoneWork(tensors)

    def reduce(self, tensors, opts):
        for t in tensors:
            code, weight = self._redop(opts.reduceOp, t, "reduce")
            if weight is not None:
                raise ValueError("gradwire backend: reduce: PREMUL_SUM is supported by all_reduce only")
            dt = self._dtype(t, None, "reduce")
            w = self._contig(t)
            if w.numel():
                self._call("gwReduce", _ptr(w), _ptr(w), w.numel(), dt, code, int(opts.rootRank), self._h)
            self._back(t, w)
        return _DoneWork(tensors)

    def _gather_flat(self, inp, what):
        """Every rank's `inp`, concatenated in rank order (a new tensor)."""
        dt = self._dtype(inp, None, what)
        src = self._contig(inp)
        flat = torch.empty(src.numel() * self.size(), dtype=src.dtype)
        if src.numel():
            self._call("gwAllGather", _ptr(src), _ptr(flat), src.numel(), dt, self._h)
        return flat

    def allgather(self, output_tensors, input_tensors, opts):
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError(f"gradwire backend: all_gather: {len(outs)} output tensors for {self.size()} ranks")
            flat = self._gather_flat(inp, "all_gather")
            n = inp.numel()
            for i, out in enumerate(outs):
                if out.numel() != n:
                    raise ValueError(f"gradwire backend: all_gather: output {i} has {out.numel()} elements, input {n}")
                out.copy_(flat.narrow(0, i * n, n).view_as(out))
        return _DoneWork(output_tensors)

    def _allgather_base(self, output, input, opts):
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"gradwire backend: all_gather_into_tensor: output has {output.numel()} elements, "
                f"want {input.numel()} x {self.size()} ranks"
            )
        dt = self._dtype(input, None, "all_gather_into_tensor")
        self._dtype(output, None, "all_gather_into_tensor")
        src, dst = self._contig(input), self._contig(output)
        if src.numel():
            self._call("gwAllGather", _ptr(src), _ptr(dst), src.numel(), dt, self._h)
        self._back(output, dst)
        return _DoneWork(output)

    all_gather_single = _allgather_base

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs):
            self._allgather_base(out, inp, opts)
        return _DoneWork(outputs)

    def allgather_coalesced(self, output_lists, inputs, opts):
        return self.allgather(output_lists, inputs, opts)

    def _reduce_scatter_flat(self, flat, out, reduce_op, what):
        code, weight = self._redop(reduce_op, out, what)
        if weight is not None:
            raise ValueError(f"gradwire backend: {what}: PREMUL_SUM is supported by all_reduce only")
        dt = self._dtype(out, None, what)
        dst = self._contig(out)
        if dst.numel():
            self._call("gwReduceScatter", _ptr(flat), _ptr(dst), dst.numel(), dt, code, self._h)
        self._back(out, dst)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self.size():
                raise ValueError(f"gradwire backend: reduce_scatter: {len(ins)} input tensors for {self.size()} ranks")
            for i, t in enumerate(ins):
                if t.numel() != out.numel():
                    raise ValueError(
                        f"gradwire backend: reduce_scatter: input {i} has {t.numel()} elements, output {out.numel()}"
                    )
            flat = torch.cat([t.contiguous().view(-1) for t in ins])
            self._reduce_scatter_flat(flat, out, opts.reduceOp, "reduce_scatter")
        return _DoneWork(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        if input.numel() != output.numel() * self.size():
            raise ValueError(
                f"gradwire backend: reduce_scatter_tensor: input has {input.numel()} elements, "
                f"want {output.numel()} x {self.size()} ranks"
            )
        self._reduce_scatter_flat(self._contig(input), output, opts.reduceOp, "reduce_scatter_tensor")
        return _DoneWork(output)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs):
            self._reduce_scatter_base(out, inp, opts)
        return _DoneWork(outputs)

    def gather(self, output_tensors, input_tensors, opts):
        # All ranks gather (the C ABI has no gather); the root keeps it.
        root = int(opts.rootRank)
        for idx, inp in enumerate(input_tensors):
            flat = self._gather_flat(inp, "gather")
            if self.rank() == root:
                outs = output_tensors[idx]
                n = inp.numel()
                for i, out in enumerate(outs):
                    out.copy_(flat.narrow(0, i * n, n).view_as(out))
        return _DoneWork(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        # The root's pieces are broadcast (the C ABI has no scatter); each
        # rank keeps its own.
        root = int(opts.rootRank)
        for idx, out in enumerate(output_tensors):
            dt = self._dtype(out, None, "scatter")
            n = out.numel()
            if self.rank() == root:
                flat = torch.cat([t.contiguous().view(-1) for t in input_tensors[idx]])
            else:
                flat = torch.empty(n * self.size(), dtype=out.dtype)
            if flat.numel() != n * self.size():
                raise ValueError(f"gradwire backend: scatter: the root's pieces hold {flat.numel()} elements, want {n} x {self.size()}")
            if flat.numel():
                self._call("gwBroadcast", _ptr(flat), _ptr(flat), flat.numel(), dt, root, self._h)
            out.copy_(flat.narrow(0, self.rank() * n, n).view_as(out))
        return _DoneWork(output_tensors)

    def barrier(self, opts):
        self._call("gwBarrier", self._h)
        return _DoneWork(None)

    def _unsupported(self, what):
        raise RuntimeError(
            f"gradwire backend: {what} is not supported: gradwire's C ABI has no {what} yet "
            "(use the gloo backend for it, e.g. a second process group)"
        )

    def _p2p(self, fname, tensors, peer, tag, what):
        if tag != 0:
            raise ValueError(f"gradwire backend: {what}: tag {tag}: gradwire matches messages in order, without tags (use tag 0)")
        if len(tensors) != 1:
            raise ValueError(f"gradwire backend: {what}: one tensor per call, got {len(tensors)}")
        t = tensors[0]
        dt = self._dtype(t, None, what)
        if not t.is_contiguous():
            raise ValueError(f"gradwire backend: {what}: the tensor must be contiguous")
        req = ctypes.c_void_p()
        self._call(fname, _ptr(t), t.numel(), dt, int(peer), self._h, ctypes.byref(req))
        work = _AsyncWork(req, [t], what, self._h)
        self._waiter.add(work)
        return work

    def send(self, tensors, dst, tag=0):
        # Starts at once, beside gradwire's other requests: exchanging ranks
        # may both post their send first.
        return self._p2p("gwSendAsync", tensors, dst, tag, "send")

    def recv(self, tensors, src, tag=0):
        return self._p2p("gwRecvAsync", tensors, src, tag, "recv")

    def recv_anysource(self, tensors, tag=0):
        self._unsupported("recv from any source")

    def _alltoallv(self, out, inp, out_counts, in_counts, what):
        dt = self._dtype(inp, None, what)
        self._dtype(out, None, what)
        if out.dtype != inp.dtype:
            raise TypeError(f"gradwire backend: {what}: input {inp.dtype}, output {out.dtype}")
        n = self.size()
        arr = ctypes.c_size_t * n

        def displs(counts):
            d, at = [], 0
            for c in counts:
                d.append(at)
                at += c
            return arr(*d), at

        sd, s_end = displs(in_counts)
        rd, r_end = displs(out_counts)
        if s_end != inp.numel() or r_end != out.numel():
            raise ValueError(
                f"gradwire backend: {what}: the splits cover {s_end} input and {r_end} output elements, "
                f"the tensors hold {inp.numel()} and {out.numel()}"
            )
        src, dst = self._contig(inp), self._contig(out)
        self._call(
            "gwAllToAllv", _ptr(src), arr(*in_counts), sd, _ptr(dst), arr(*out_counts), rd, dt, self._h
        )
        self._back(out, dst)

    def alltoall(self, output_tensors, input_tensors, opts):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"gradwire backend: all_to_all: {len(input_tensors)} inputs and {len(output_tensors)} outputs for {n} ranks")
        flat_in = torch.cat([t.contiguous().view(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        self._alltoallv(flat_out, flat_in, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors], "all_to_all")
        at = 0
        for t in output_tensors:
            t.copy_(flat_out.narrow(0, at, t.numel()).view_as(t))
            at += t.numel()
        return _DoneWork(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        n = self.size()
        rows = lambda t: t.numel() // t.size(0) if t.dim() and t.size(0) else 1  # noqa: E731
        if not input_split_sizes:
            if input.dim() == 0 or input.size(0) % n:
                raise ValueError(f"gradwire backend: all_to_all_single: {tuple(input.shape)} does not split into {n} equal parts")
            input_split_sizes = [input.size(0) // n] * n
        if not output_split_sizes:
            if output.dim() == 0 or output.size(0) % n:
                raise ValueError(f"gradwire backend: all_to_all_single: {tuple(output.shape)} does not split into {n} equal parts")
            output_split_sizes = [output.size(0) // n] * n
        if len(input_split_sizes) != n or len(output_split_sizes) != n:
            raise ValueError(f"gradwire backend: all_to_all_single: splits for {len(input_split_sizes)} ranks, the group has {n}")
        self._alltoallv(
            output, input,
            [s * rows(output) for s in output_split_sizes],
            [s * rows(input) for s in input_split_sizes],
            "all_to_all_single",
        )
        return _DoneWork(output)

    all_to_all_single = alltoall_base

    def shutdown(self):
        c, self._comm = self._comm, None
        if c is not None:
            self._waiter.close()  # every queued request finished first
            c.destroy()

    def abort(self):
        c, self._comm = self._comm, None
        if c is not None:
            c.abort()


def _create(opts, backend_options=None):
    return GradwireBackend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        group_name=getattr(opts, "group_id", None) or "default",
    )


if "gradwire" not in dist.Backend.backend_list:
    dist.Backend.register_backend("gradwire", _create, extended_api=True, devices=["cpu"])

from . import hooks, job  # noqa: E402  (need the backend registered first)
