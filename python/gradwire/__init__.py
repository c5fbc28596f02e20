"""gradwire for Python: collectives on numpy arrays over gradwire's C ABI.

    import gradwire, numpy as np
    comm = gradwire.init()                      # under `gwrun -n N python prog.py`
    g = comm.allreduce(np.ones(10, np.float32), op="sum")
    g = comm.allreduce(grad, weight=local_batch / global_batch)   # Σ_r w_r·grad_r
    req = comm.allreduce_async(grad); ...; g = req.wait()
    with comm.allreduce_init(grad) as req:      # persistent: planned once, in place on grad
        for step in ...: ...fill grad...; req.start(); ...; req.wait()
    comm.destroy()                              # or: with gradwire.init() as comm: ...

Under a gwjob agent, each step follows the job server's plan:
    s = comm.step_begin()                       # StepInfo(step, local_batch, weight, algo, ...)
    ...compute s.local_batch samples..., g = comm.allreduce(grad, weight=s.weight)
    if comm.step_end(s.local_batch, compute_s, comm_s, step_s): break   # server says stop

Enums and result codes are read from gradwire.h at import; errors raise
GradwireError subclasses carrying the code name and gwGetLastError's message.
"""

import builtins
import ctypes
import enum
import os
import threading
import time
import weakref

import numpy as np

from . import _header, _lib, _step

__all__ = [
    "init", "init_rank", "get_unique_id", "version", "trace_span", "Comm", "Request",
    "PersistentRequest", "Registration",
    "GradwireError",
    "Result", "DataType", "RedOp", "error_class", "HEADER_PATH", "LIBRARY_PATH", "StepInfo",
    "resume_step",
]

HEADER_PATH = _lib.find_header()
ENUMS, DEFINES = _header.load(HEADER_PATH)
_C, LIBRARY_PATH = _lib.load_library()
_lib.declare(_C)
_StepInfoC, _StepReportC = _step.build(HEADER_PATH, DEFINES)
_HAS_STEP = _step.declare(_C, _StepInfoC, _StepReportC)
StepInfo = _step.StepInfo


def _short(name):
    return name[2:] if name.startswith("gw") else name


Result = enum.IntEnum("Result", {_short(k): v for k, v in ENUMS["gwResult_t"].items()})
DataType = enum.IntEnum("DataType", {_short(k): v for k, v in ENUMS["gwDataType_t"].items()})
RedOp = enum.IntEnum("RedOp", {_short(k): v for k, v in ENUMS["gwRedOp_t"].items()})
_CODE_NAME = {v: k for k, v in ENUMS["gwResult_t"].items()}
_SUCCESS = ENUMS["gwResult_t"].get("gwSuccess", 0)
_TIMEOUT = ENUMS["gwResult_t"].get("gwTimeout")
_INVALID_USAGE = ENUMS["gwResult_t"].get("gwInvalidUsage")

# Operators by lower-case name: gwSum -> "sum", ...
OPS = {_short(k).lower(): v for k, v in ENUMS["gwRedOp_t"].items()}

# numpy dtype -> gwDataType_t, by the enumerator's name: gwFloat32 -> numpy "float32".
DTYPES = {}
for _k, _v in ENUMS["gwDataType_t"].items():
    _n = _short(_k).lower()
    try:
        _dt = np.dtype(_n)
    except TypeError:
        if _n != "bfloat16":
            continue
        try:
            import ml_dtypes  # optional
        except ImportError:
            continue
        _dt = np.dtype(ml_dtypes.bfloat16)
    DTYPES[_dt] = _v
_DTYPE_NAME = {v: _short(k).lower() for k, v in ENUMS["gwDataType_t"].items()}


class GradwireError(Exception):
    """A gradwire call failed. `code` (int), `code_name` (e.g. "gwInvalidArgument"),
    `message` (gwGetLastError's text), `function` (the C function)."""

    code = None
    code_name = None

    def __init__(self, code, message, function=None):
        self.code = code
        self.code_name = _CODE_NAME.get(code, f"unknown result {code}")
        self.message = message
        self.function = function
        where = f"{function}: " if function else ""
        super().__init__(f"{where}{self.code_name}: {message}")


_ERROR_CLASSES = {}
for _k, _v in ENUMS["gwResult_t"].items():
    if _v == _SUCCESS:
        continue
    _cname = _short(_k) if _short(_k).endswith("Error") else _short(_k) + "Error"
    # gradwire.TimeoutError is also a builtins.TimeoutError (so `except TimeoutError` works).
    _bases = (GradwireError,) + ((builtins.TimeoutError,) if _cname == "TimeoutError" else ())
    _cls = type(_cname, _bases, {"__module__": __name__, "__doc__": f"{_k} (= {_v})"})
    _cls.code, _cls.code_name = _v, _k
    _ERROR_CLASSES[_v] = _cls
    globals()[_cname] = _cls
    __all__.append(_cname)


def error_class(code):
    """The GradwireError subclass of a result code (int, Result, or its name, e.g. "gwAborted")."""
    if isinstance(code, str):
        code = ENUMS["gwResult_t"].get(code, ENUMS["gwResult_t"].get("gw" + code))
    return _ERROR_CLASSES.get(code, GradwireError)


def _last_error(handle):
    s = _C.gwGetLastError(handle)
    return s.decode("utf-8", "replace") if s else ""


def _check(res, function, handle=None):
    if res != _SUCCESS:
        raise error_class(res)(res, _last_error(handle), function)


# gwStepBegin's "checkpoint and exit 0" (an empty tuple, which catches
# nothing, with a header older than it).
_PREEMPTED = _ERROR_CLASSES.get(ENUMS["gwResult_t"].get("gwPreempted"), ())


def resume_step():
    """The step this worker starts at: 0, or where the job server resumes a job
    its scheduling policy preempted (GW_RESUME_STEP; load the checkpoint saved
    when step_begin raised PreemptedError and begin there)."""
    return _step.resume_step(os.environ.get("GW_RESUME_STEP"))


def version():
    v = ctypes.c_int()
    _check(_C.gwGetVersion(ctypes.byref(v)), "gwGetVersion")
    return v.value


class trace_span:
    """Under GW_TRACE, puts the enclosed work on this rank's `compute` lane of
    the timeline, beside the collectives (gwTraceSpan)::

        with gradwire.trace_span("forward", step=k):
            loss = model(x)

    `name`: 1 to 64 letters, digits and _ - . : / (checked as the block
    ends, even with tracing off: gradwire.InvalidArgumentError names it).
    Without GW_TRACE it costs two clock reads and one call.
    """

    def __init__(self, name, step=0):
        self._name = name.encode("utf-8") if isinstance(name, str) else bytes(name)
        self._step = int(step)
        self._t0 = None

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        seconds = time.perf_counter() - self._t0
        _check(_C.gwTraceSpan(self._name, seconds, self._step), "gwTraceSpan")
        return False


def get_unique_id():
    """A rendezvous id (bytes) for init_rank; starts a store in this process."""
    uid = _lib.UniqueId()
    _check(_C.gwGetUniqueId(ctypes.byref(uid)), "gwGetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


def init():
    """A communicator from the environment `gwrun` sets (gwCommInitFromEnv)."""
    h = ctypes.c_void_p()
    _check(_C.gwCommInitFromEnv(ctypes.byref(h)), "gwCommInitFromEnv")
    return Comm(h)


def init_rank(nranks, unique_id, rank):
    """gwCommInitRank with an id from get_unique_id (sent to every rank by you)."""
    uid = _lib.UniqueId()
    ctypes.memmove(ctypes.addressof(uid), bytes(unique_id), min(len(unique_id), ctypes.sizeof(uid)))
    h = ctypes.c_void_p()
    _check(_C.gwCommInitRank(ctypes.byref(h), int(nranks), uid, int(rank)), "gwCommInitRank")
    return Comm(h)


def _dtype_code(dt):
    try:
        return DTYPES[np.dtype(dt)]
    except KeyError:
        names = ", ".join(sorted(str(d) for d in DTYPES))
        raise TypeError(f"gradwire: dtype {np.dtype(dt)} is not supported (supported: {names})") from None


def _op_code(op):
    if isinstance(op, str):
        try:
            return OPS[op.lower()]
        except KeyError:
            raise ValueError(f"gradwire: unknown op {op!r} (one of {', '.join(OPS)})") from None
    return int(op)


class _Dev:
    """A device array (anything with `__cuda_array_interface__`: CuPy,
    PyTorch CUDA tensors, Numba), seen through the same attributes the
    calls read from numpy arrays."""

    def __init__(self, obj):
        iface = obj.__cuda_array_interface__
        self.obj = obj
        self.shape = tuple(iface["shape"]) or (1,)
        self.dtype = np.dtype(iface["typestr"])
        self.size = int(np.prod(self.shape))
        self.ptr = iface["data"][0]
        strides = iface.get("strides")
        if strides is not None and tuple(strides) != _c_strides(self.shape, self.dtype.itemsize):
            raise ValueError("gradwire: device arrays must be C-contiguous (call .contiguous() or "
                             "cupy.ascontiguousarray first)")

    @property
    def ndim(self):
        return len(self.shape)


def _c_strides(shape, itemsize):
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _is_device(x):
    return hasattr(x, "__cuda_array_interface__")


def _empty_like_kind(like, shape, dtype):
    """A new device array of `like`'s kind (torch or CuPy) and device."""
    mod = type(like.obj).__module__.split(".")[0]
    if mod == "torch":
        import torch
        tdt = torch.from_numpy(np.empty(0, dtype)).dtype
        return _Dev(torch.empty(shape, dtype=tdt, device=like.obj.device))
    if mod == "cupy":
        import cupy
        with cupy.cuda.Device(like.obj.device.id):
            return _Dev(cupy.empty(shape, dtype))
    raise TypeError(f"gradwire: cannot allocate a result like a {type(like.obj).__name__}; pass out=")


def _stream_handle(stream):
    """A raw cudaStream_t from a torch or CuPy stream, or an int."""
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return ctypes.c_void_p(int(getattr(stream, attr)))
    return ctypes.c_void_p(int(stream))


def _result(r):
    return r.obj if isinstance(r, _Dev) else r


def _send(array):
    """A C-contiguous numpy view of `array` (copied if it is not contiguous),
    or a device array as it is."""
    if _is_device(array):
        return _Dev(array)
    a = np.asarray(array)
    if a.ndim == 0:
        a = a.reshape(1)
    return np.ascontiguousarray(a)


def _recv(out, shape, dtype, what, like=None):
    if out is None:
        if isinstance(like, _Dev):
            return _empty_like_kind(like, shape, dtype)
        return np.empty(shape, dtype)
    if _is_device(out):
        out = _Dev(out)  # refuses a strided array itself
    elif not isinstance(out, np.ndarray):
        raise TypeError(f"gradwire: {what}: out must be a numpy array")
    elif not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"gradwire: {what}: out must be a writeable C-contiguous array")
    if out.dtype != dtype:
        raise TypeError(f"gradwire: {what}: out has dtype {out.dtype}, expected {np.dtype(dtype)}")
    if out.size != int(np.prod(shape)):
        raise ValueError(f"gradwire: {what}: out has {out.size} elements, expected {int(np.prod(shape))}")
    return out


def _ptr(a):
    if isinstance(a, _Dev):
        return ctypes.c_void_p(a.ptr)
    return ctypes.c_void_p(a.ctypes.data)


class Request:
    """A pending ...Async call. Holds the arrays until it finishes."""

    def __init__(self, comm, handle, function, keep, result):
        self._comm = comm
        self._h = handle
        self._function = function
        self._keep = keep  # buffers C reads or writes: alive until gwWait returns
        self._result = result
        self._done = False
        self._error = None

    def test(self):
        """True if finished (without blocking); raises the operation's error if it failed."""
        if self._done:
            if self._error is not None:
                raise self._error
            return True
        d = ctypes.c_int()
        res = _C.gwTest(self._h, ctypes.byref(d))
        if res != _SUCCESS:
            self.wait()  # frees the request and raises its error
        return bool(d.value)

    def wait(self, timeout_ms=-1):
        """Waits (at most timeout_ms ms; <0 without limit) and returns the result array
        (None for barrier). Raises gradwire.TimeoutError if still running (the request
        stays valid), or the operation's error."""
        if self._done:
            if self._error is not None:
                raise self._error
            return self._result
        res = _C.gwWait(self._h, int(timeout_ms))
        if res == _TIMEOUT and timeout_ms >= 0:
            # Still running (request valid), or the operation itself timed out (freed)?
            d = ctypes.c_int()
            if _C.gwTest(self._h, ctypes.byref(d)) != _INVALID_USAGE:
                raise error_class(res)(res, _last_error(self._comm._h), "gwWait")
        self._finish()
        if res != _SUCCESS:
            self._error = error_class(res)(res, _last_error(self._comm._h), self._function)
            raise self._error
        return self._result

    def _finish(self):
        self._done = True
        self._keep = None
        self._comm._pending.pop(id(self), None)


class PersistentRequest:
    """A persistent all-reduce (Comm.allreduce_init, gwAllReduceInit): planned once
    (algorithm, schedule, registered buffers, connections), then each start() runs
    one round on the same arrays, reading the input array at that moment. Holds the
    arrays until freed. Rounds must be started in the same order on every rank.
    free() (or leaving a `with` block, or garbage collection) waits for a running
    round, then frees the request; later calls raise InvalidUsageError."""

    def __init__(self, comm, handle, keep, result):
        self._comm = comm
        self._h = handle
        self._keep = keep  # the arrays C reads and writes: alive until freed
        self._result = result

    def _handle(self):
        if self._h is None:
            raise error_class("gwInvalidUsage")(_INVALID_USAGE, "persistent request was freed", None)
        return self._h

    def _call(self, fname, *args):
        # The request's errors are on the calling thread's record (gwGetLastError(NULL)).
        _check(getattr(_C, fname)(self._handle(), *args), fname, None)

    @property
    def array(self):
        """The result array (the input array itself when in place)."""
        return self._result

    def start(self):
        """Begins one round (gwStart); raises InvalidUsageError if one is running."""
        self._call("gwStart")
        return self

    def test(self):
        """True if no round is running (without blocking); raises a finished round's error."""
        d = ctypes.c_int()
        self._call("gwTest", ctypes.byref(d))
        return bool(d.value)

    def wait(self, timeout_ms=-1):
        """Waits for the running round (at most timeout_ms ms; <0 without limit) and
        returns the result array; raises gradwire.TimeoutError if it is still running
        (the request stays valid), or the round's error. Returns at once if none runs."""
        self._call("gwWait", int(timeout_ms))
        return self._result

    def free(self):
        """Waits for a running round, then frees the request (idempotent)."""
        h, self._h = self._h, None
        if h is None:
            return
        self._comm._persistent.pop(id(self), None)
        try:
            _check(_C.gwRequestFree(h), "gwRequestFree", None)
        finally:
            self._keep = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.free()
        return False

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass

    def __repr__(self):
        state = "freed" if self._h is None else f"{self._result.dtype}[{self._result.size}]"
        return f"<gradwire.PersistentRequest {state}>"


class Registration:
    """Memory registered once with a communicator's transports (Comm.register,
    gwCommRegister): later calls whose arrays lie inside it skip registering them.
    Holds the array until deregistered. deregister() (or leaving a `with` block, or
    garbage collection, which therefore may block briefly) waits for this rank's
    earlier calls on the memory, then withdraws the registration. Only RDMA
    transports use registrations; elsewhere they change nothing."""

    def __init__(self, comm, handle, keep):
        self._comm = comm
        self._h = handle
        self._keep = keep  # the registered memory: alive until deregistered

    @property
    def array(self):
        return self._keep

    def deregister(self):
        """Withdraws the registration (idempotent). Should it fail, the memory stays
        registered and held, and deregister() may be called again."""
        with self._comm._lock:
            h, comm = self._h, self._comm._h
            if h is None:
                return
            if comm is not None:  # a destroyed communicator took its registrations along
                _check(_C.gwCommDeregister(comm, h), "gwCommDeregister", comm)
            self._h, self._keep = None, None
            self._comm._registrations.pop(id(self), None)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.deregister()
        return False

    def __del__(self):
        try:
            self.deregister()
        except Exception:
            pass

    def __repr__(self):
        state = "deregistered" if self._h is None else "registered"
        return f"<gradwire.Registration {state}>"


class Comm:
    """A gradwire communicator. Calls must be issued in the same order on every rank."""

    def __init__(self, handle):
        self._h = handle
        self._pending = {}
        # Persistent requests, freed by destroy(); weak, so an unreferenced one is
        # freed by garbage collection instead.
        self._persistent = weakref.WeakValueDictionary()
        # Registrations, likewise (dropped by destroy, deregistered by collection).
        self._registrations = weakref.WeakValueDictionary()
        self._lock = threading.RLock()  # re-entered when collection deregisters under it
        r, n = ctypes.c_int(), ctypes.c_int()
        _check(_C.gwCommRank(self._h, ctypes.byref(r)), "gwCommRank", self._h)
        _check(_C.gwCommCount(self._h, ctypes.byref(n)), "gwCommCount", self._h)
        self.rank, self.size = r.value, n.value

    # -- lifecycle
    def _handle(self):
        if self._h is None:
            raise error_class("gwInvalidUsage")(_INVALID_USAGE, "communicator was destroyed", None)
        return self._h

    def abort(self):
        """Fails every call in flight on this communicator (from any thread) and later ones."""
        _check(_C.gwCommAbort(self._handle()), "gwCommAbort", self._h)

    def destroy(self):
        """Waits for pending requests, then frees the communicator (idempotent)."""
        with self._lock:
            h, self._h = self._h, None
            regs = list(self._registrations.values())
        if h is None:
            return
        for preq in list(self._persistent.values()):
            try:
                preq.free()  # waits for a running round: the arrays must outlive it
            except GradwireError:
                pass
        for req in list(self._pending.values()):
            res = _C.gwWait(req._h, -1)  # the buffers must outlive the operation
            if res != _SUCCESS:
                req._error = error_class(res)(res, _last_error(h), req._function)
            req._done, req._keep = True, None
        self._pending.clear()
        try:
            _check(_C.gwCommDestroy(h), "gwCommDestroy")
        finally:
            for reg in regs:  # withdrawn with the communicator; their memory may go now
                reg._h, reg._keep = None, None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self._h is not None:
            try:
                self.abort()
            except GradwireError:
                pass
        self.destroy()
        return False

    def __del__(self):
        try:
            if self._h is not None:
                self.destroy()
        except Exception:
            pass

    def __repr__(self):
        state = "destroyed" if self._h is None else f"rank {self.rank} of {self.size}"
        return f"<gradwire.Comm {state}>"

    # -- helpers
    def _call(self, fname, *args):
        _check(getattr(_C, fname)(*args), fname, self._h)

    def _async(self, fname, args, keep, result):
        req_h = ctypes.c_void_p()
        self._call(fname, *args, ctypes.byref(req_h))
        req = Request(self, req_h, fname, keep, result)
        self._pending[id(req)] = req
        return req

    def _allreduce_args(self, array, op, weight, out):
        a = _send(array)
        dt = _dtype_code(a.dtype)
        r = _recv(out, a.shape, a.dtype, "allreduce", a)
        if weight is not None:
            if op not in ("sum", None) and _op_code(op) != OPS.get("sum"):
                raise ValueError("gradwire: allreduce: weight is only valid with op='sum'")
            return "gwAllReduceWeighted", (_ptr(a), _ptr(r), a.size, dt, float(weight), self._handle()), a, r
        return "gwAllReduce", (_ptr(a), _ptr(r), a.size, dt, _op_code(op), self._handle()), a, r

    def _reduce_scatter_args(self, array, op, out):
        a = _send(array)
        if a.size % self.size:
            raise ValueError(f"gradwire: reduce_scatter: {a.size} elements do not split over {self.size} ranks")
        n = a.size // self.size
        shape = (a.shape[0] // self.size,) + a.shape[1:] if a.shape[0] % self.size == 0 else (n,)
        r = _recv(out, shape, a.dtype, "reduce_scatter", a)
        return (_ptr(a), _ptr(r), n, _dtype_code(a.dtype), _op_code(op), self._handle()), a, r

    def _allgather_args(self, array, out):
        a = _send(array)
        r = _recv(out, (self.size,) + a.shape, a.dtype, "allgather", a)
        return (_ptr(a), _ptr(r), a.size, _dtype_code(a.dtype), self._handle()), a, r

    def _broadcast_args(self, array, root, out):
        a = _send(array)
        r = _recv(out, a.shape, a.dtype, "broadcast", a)
        return (_ptr(a), _ptr(r), a.size, _dtype_code(a.dtype), int(root), self._handle()), a, r

    # -- blocking collectives (numpy arrays, or device arrays: anything with
    # __cuda_array_interface__; with stream=, ordered on that CUDA stream)
    def _run(self, fname, args, stream):
        if stream is None:
            self._call(fname, *args)
        else:
            self._call(fname + "Stream", *args, _stream_handle(stream))

    def allreduce(self, array, op="sum", weight=None, out=None, stream=None):
        """Element-wise `op` over ranks; with `weight`, Σ_r weight_r·array_r (floating types).
        Returns `out` (a new array of the input's kind if None; may be `array` itself for in
        place)."""
        fname, args, a, r = self._allreduce_args(array, op, weight, out)
        if stream is not None and weight is not None:
            raise ValueError("gradwire: allreduce: weight has no stream-ordered form")
        self._run(fname, args, stream)
        return _result(r)

    def reduce_scatter(self, array, op="sum", out=None, stream=None):
        """Rank r gets block r of the reduction (array.size must divide by size)."""
        args, a, r = self._reduce_scatter_args(array, op, out)
        self._run("gwReduceScatter", args, stream)
        return _result(r)

    def allgather(self, array, out=None, stream=None):
        """Every rank's array stacked in rank order: shape (size, *array.shape)."""
        args, a, r = self._allgather_args(array, out)
        self._run("gwAllGather", args, stream)
        return _result(r)

    def broadcast(self, array, root=0, out=None, stream=None):
        """root's array on every rank (array's shape and dtype must agree on all ranks)."""
        args, a, r = self._broadcast_args(array, root, out)
        self._run("gwBroadcast", args, stream)
        return _result(r)

    def reduce(self, array, op="sum", root=0, out=None, stream=None):
        """The reduction on `root` (returned there); None on the other ranks."""
        a = _send(array)
        r = _recv(out, a.shape, a.dtype, "reduce", a)
        self._run("gwReduce", (_ptr(a), _ptr(r), a.size, _dtype_code(a.dtype), _op_code(op),
                               int(root), self._handle()), stream)
        return _result(r) if self.rank == int(root) else None

    def barrier(self):
        self._call("gwBarrier", self._handle())

    # -- step protocol (workers started by a gwjob agent)
    @staticmethod
    def _need_step():
        if not _HAS_STEP:
            raise RuntimeError(f"gradwire: {LIBRARY_PATH} has no gwStepBegin/gwStepEnd: "
                               "rebuild it (cargo build -p gw-capi) or set GRADWIRE_LIB")

    def step_begin(self):
        """The job server's plan for this rank's next step: StepInfo(step, global_batch,
        local_batch, offset, weight, algo, predicted_step_s), predicted_step_s None when
        unknown. Pass `weight` to allreduce(grad, weight=...). Calling it again before
        step_end returns the same step. Raises InvalidUsageError when the program was not
        started by a gwjob agent (GW_JOB_SERVER unset), AbortedError when the job was
        stopped, TimeoutError when the server stayed unreachable for GW_JOB_RETRY_S s,
        PreemptedError when a scheduling policy takes the job off its nodes: its `step`
        is where the job resumes (save everything through step - 1, exit 0; the next
        placement starts with resume_step() == step)."""
        self._need_step()
        info = _StepInfoC()
        try:
            self._call("gwStepBegin", self._handle(), ctypes.byref(info))
        except _PREEMPTED as e:
            e.step = info.step
            raise
        return _step.info_tuple(info)

    def step_end(self, samples, compute_s, comm_s, step_s, local_grad_sq=None, global_grad_sq=None):
        """Reports the step begun last (seconds; grad norms squared when measured) and
        returns True when the job server asks this worker to stop."""
        self._need_step()
        rep = _step.report(_StepReportC, samples, compute_s, comm_s, step_s,
                           local_grad_sq, global_grad_sq)
        stop = ctypes.c_int()
        self._call("gwStepEnd", self._handle(), ctypes.byref(rep), ctypes.byref(stop))
        return bool(stop.value)

    # -- non-blocking collectives (Request.wait() returns what the blocking call returns)
    def allreduce_async(self, array, op="sum", weight=None, out=None):
        fname, args, a, r = self._allreduce_args(array, op, weight, out)
        return self._async(fname + "Async", args, (a, r), r)

    def reduce_scatter_async(self, array, op="sum", out=None):
        args, a, r = self._reduce_scatter_args(array, op, out)
        return self._async("gwReduceScatterAsync", args, (a, r), r)

    def allgather_async(self, array, out=None):
        args, a, r = self._allgather_args(array, out)
        return self._async("gwAllGatherAsync", args, (a, r), r)

    def broadcast_async(self, array, root=0, out=None):
        args, a, r = self._broadcast_args(array, root, out)
        return self._async("gwBroadcastAsync", args, (a, r), r)

    def barrier_async(self):
        return self._async("gwBarrierAsync", (self._handle(),), None, None)

    # -- registered memory (NCCL's ncclCommRegister)
    def register(self, array):
        """A Registration of `array`'s memory (a C-contiguous numpy array, or a device
        array, which is accepted and changes nothing: device data is staged through
        buffers registered already). Calls on arrays inside it, views included, then
        skip registering their memory. Local to this rank."""
        if _is_device(array):
            d = _Dev(array)
            keep, ptr, nbytes = array, d.ptr, max(d.size * d.dtype.itemsize, 1)
        else:
            if not isinstance(array, np.ndarray):
                raise TypeError("gradwire: register: array must be a numpy array")
            if not array.flags.c_contiguous:
                raise ValueError("gradwire: register: array must be C-contiguous")
            keep, ptr, nbytes = array, array.ctypes.data, array.nbytes
        h = ctypes.c_void_p()
        with self._lock:
            _check(_C.gwCommRegister(self._handle(), ctypes.c_void_p(ptr), nbytes, ctypes.byref(h)),
                   "gwCommRegister", self._h)
            reg = Registration(self, h, keep)
            self._registrations[id(reg)] = reg
        return reg

    # -- persistent collectives (planned once, started many times)
    def allreduce_init(self, array, op="sum", out=None):
        """A PersistentRequest all-reducing `array` into `out` (in place into `array`
        when `out` is None or `array`) with `op` at every start(). Collective. Both
        must be C-contiguous numpy arrays (no copy is made: each round reads `array`
        as it is then); `out` must match `array`'s dtype and size."""
        if not isinstance(array, np.ndarray):
            raise TypeError("gradwire: allreduce_init: array must be a numpy array (rounds read it in place)")
        if not array.flags.c_contiguous:
            raise ValueError("gradwire: allreduce_init: array must be C-contiguous (rounds read it in place)")
        dt = _dtype_code(array.dtype)
        if out is None or out is array:
            if not array.flags.writeable:
                raise ValueError("gradwire: allreduce_init: array must be writeable to reduce in place")
            r = array
        else:
            r = _recv(out, array.shape, array.dtype, "allreduce_init")
        h = ctypes.c_void_p()
        self._call("gwAllReduceInit", _ptr(array), _ptr(r), array.size, dt, _op_code(op), self._handle(),
                   ctypes.byref(h))
        req = PersistentRequest(self, h, (array, r), r)
        self._persistent[id(req)] = req
        return req
