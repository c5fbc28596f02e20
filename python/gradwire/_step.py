"""The step protocol (gwStepBegin / gwStepEnd) for Python workers.

The two C structs are built from their declarations in gradwire.h at import,
like the enums, so the binding cannot drift from the ABI: a field added,
renamed or retyped in the header changes the ctypes layout with it.
"""

import collections
import ctypes
import math
import re

from ._header import HeaderError

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRUCT = re.compile(r"typedef\s+struct\s*(?:\w+\s*)?\{(?P<body>[^}]*)\}\s*(?P<name>\w+)\s*;", re.S)
_FIELD = re.compile(r"^(?P<type>[A-Za-z_][\w ]*?)\s+(?P<name>[A-Za-z_]\w*)\s*(?:\[\s*(?P<n>\w+)\s*\])?$")

_CTYPES = {
    "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64,
    "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32,
    "uint8_t": ctypes.c_uint8, "int": ctypes.c_int, "double": ctypes.c_double,
    "float": ctypes.c_float, "char": ctypes.c_char, "size_t": ctypes.c_size_t,
}

STRUCTS = ("gwStepInfo", "gwStepReport")

# What step_begin returns. predicted_step_s is None while the planner has no fit.
StepInfo = collections.namedtuple(
    "StepInfo", "step global_batch local_batch offset weight algo predicted_step_s")


def parse_structs(text, defines, path="gradwire.h"):
    """{struct name: [(field, ctype)]} for the typedef'd structs of the header."""
    text = _COMMENT.sub(" ", text)
    out = {}
    for m in _STRUCT.finditer(text):
        fields = []
        for decl in m.group("body").split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            f = _FIELD.match(decl)
            ctype = _CTYPES.get(f.group("type")) if f else None
            if ctype is None:
                fields = None  # a struct we cannot mirror (not one of ours to build)
                break
            n = f.group("n")
            if n is not None:
                count = int(n, 0) if n[0].isdigit() else defines.get(n)
                if count is None:
                    raise HeaderError(f"{path}: unknown array size {n!r} in {m.group('name')}")
                ctype = ctype * count
            fields.append((f.group("name"), ctype))
        if fields is not None:
            out[m.group("name")] = fields
    return out


def build(header_path, defines):
    """The ctypes classes of gwStepInfo and gwStepReport, from the header."""
    with open(header_path, encoding="utf-8") as f:
        structs = parse_structs(f.read(), defines, header_path)
    missing = [s for s in STRUCTS if s not in structs]
    if missing:
        raise HeaderError(f"{header_path}: no 'typedef struct {{...}} NAME;' for {', '.join(missing)}")
    return tuple(type(name, (ctypes.Structure,), {"_fields_": structs[name]}) for name in STRUCTS)


def declare(lib, info_cls, report_cls):
    """Declares gwStepBegin/gwStepEnd; False when the library predates them (the
    rest of the binding still works, the step calls raise)."""
    if not (hasattr(lib, "gwStepBegin") and hasattr(lib, "gwStepEnd")):
        return False
    vp, pint = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)
    lib.gwStepBegin.argtypes = [vp, ctypes.POINTER(info_cls)]
    lib.gwStepBegin.restype = ctypes.c_int
    lib.gwStepEnd.argtypes = [vp, ctypes.POINTER(report_cls), pint]
    lib.gwStepEnd.restype = ctypes.c_int
    return True


def info_tuple(c):
    p = c.predicted_step_s
    return StepInfo(
        step=c.step, global_batch=c.global_batch, local_batch=c.local_batch, offset=c.offset,
        weight=c.weight, algo=c.algo.decode("utf-8", "replace"),
        predicted_step_s=None if math.isnan(p) else p)


def resume_step(text):
    """GW_RESUME_STEP's value (None or a string) as a step number; ValueError
    naming the variable when it is not one."""
    if text is None or not text.strip():
        return 0
    try:
        step = int(text.strip(), 10)
    except ValueError:
        step = -1
    if step < 0:
        raise ValueError(f"GW_RESUME_STEP={text!r} is not a step number (0, 1, ...)")
    return step


def report(report_cls, samples, compute_s, comm_s, step_s, local_grad_sq, global_grad_sq):
    nan = float("nan")
    return report_cls(
        samples=int(samples), compute_s=float(compute_s), comm_s=float(comm_s),
        step_s=float(step_s),
        local_grad_sq=nan if local_grad_sq is None else float(local_grad_sq),
        global_grad_sq=nan if global_grad_sq is None else float(global_grad_sq))
