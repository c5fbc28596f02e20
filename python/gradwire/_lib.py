"""Finds gradwire.h and libgradwire.so and declares the C functions."""

import ctypes
import ctypes.util
import json
import os

from . import _header

PKG_DIR = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "libgradwire.so"
HEADER_REL = os.path.join("capi", "include", "gradwire.h")


def _is_repo(d):
    return d and os.path.isfile(os.path.join(d, HEADER_REL))


def _walk_up(start):
    d = os.path.abspath(start)
    while True:
        if _is_repo(d):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def repo_roots():
    """Candidate gradwire source trees, best first: the one the package was
    installed from, one above the package (source checkout), one above the
    working directory."""
    roots = []
    try:
        with open(os.path.join(PKG_DIR, "_build_info.json")) as f:
            r = json.load(f).get("repo")
        if _is_repo(r):
            roots.append(r)
    except (OSError, ValueError):
        pass
    for start in (PKG_DIR, os.getcwd()):
        r = _walk_up(start)
        if r and r not in roots:
            roots.append(r)
    return roots


def find_header():
    tried = []
    env = os.environ.get("GRADWIRE_HEADER")
    cands = ([("GRADWIRE_HEADER", env)] if env else []) + [("package", os.path.join(PKG_DIR, "gradwire.h"))]
    cands += [("repo", os.path.join(r, HEADER_REL)) for r in repo_roots()]
    for how, p in cands:
        if os.path.isfile(p):
            return p
        tried.append(f"{p} ({how})")
        if how == "GRADWIRE_HEADER":
            break  # an explicit choice that does not exist is an error, not a hint
    raise _header.HeaderError("gradwire: cannot find gradwire.h; tried: " + "; ".join(tried))


def load_library():
    tried = []
    env = os.environ.get("GRADWIRE_LIB")
    if env:
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise ImportError(f"gradwire: GRADWIRE_LIB={env} cannot be loaded: {e}") from e
    cands = [os.path.join(PKG_DIR, LIB_NAME)]
    for r in repo_roots():
        # The newer of a checkout's builds: a release build left from long ago
        # must not shadow the debug build made a minute ago.
        builds = [os.path.join(r, "target", prof, LIB_NAME) for prof in ("release", "debug")]
        builds.sort(key=lambda p: os.path.getmtime(p) if os.path.isfile(p) else 0, reverse=True)
        cands += builds
    for p in cands:
        if os.path.isfile(p):
            try:
                return ctypes.CDLL(p), p
            except OSError as e:
                tried.append(f"{p} ({e})")
        else:
            tried.append(f"{p} (not found)")
    for name in (LIB_NAME, ctypes.util.find_library("gradwire")):
        if name:
            try:
                return ctypes.CDLL(name), name
            except OSError as e:
                tried.append(f"{name} via system loader ({e})")
    raise ImportError(
        "gradwire: cannot load libgradwire.so (build it with `cargo build -p gw-capi`, "
        "or set GRADWIRE_LIB); tried: GRADWIRE_LIB (unset); " + "; ".join(tried)
    )


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def declare(lib):
    c_int, c_size, vp, c_double = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_double
    pint, pvp = ctypes.POINTER(c_int), ctypes.POINTER(vp)
    sigs = {
        "gwGetVersion": [pint],
        "gwTraceSpan": [ctypes.c_char_p, c_double, ctypes.c_uint64],
        "gwGetUniqueId": [ctypes.POINTER(UniqueId)],
        "gwCommInitRank": [pvp, c_int, UniqueId, c_int],
        "gwCommInitFromEnv": [pvp],
        "gwCommRank": [vp, pint],
        "gwCommCount": [vp, pint],
        "gwCommDestroy": [vp],
        "gwCommAbort": [vp],
        "gwAllReduce": [vp, vp, c_size, c_int, c_int, vp],
        "gwAllReduceWeighted": [vp, vp, c_size, c_int, c_double, vp],
        "gwReduceScatter": [vp, vp, c_size, c_int, c_int, vp],
        "gwAllGather": [vp, vp, c_size, c_int, vp],
        "gwBroadcast": [vp, vp, c_size, c_int, c_int, vp],
        "gwReduce": [vp, vp, c_size, c_int, c_int, c_int, vp],
        "gwBarrier": [vp],
        "gwSend": [vp, c_size, c_int, c_int, vp],
        "gwRecv": [vp, c_size, c_int, c_int, vp],
        "gwSendAsync": [vp, c_size, c_int, c_int, vp, pvp],
        "gwRecvAsync": [vp, c_size, c_int, c_int, vp, pvp],
        "gwSendRecv": [vp, c_size, c_int, vp, c_size, c_int, c_int, vp],
        "gwAllToAll": [vp, vp, c_size, c_int, vp],
        "gwAllToAllv": [vp, vp, vp, vp, vp, vp, c_int, vp],
        "gwAllReduceAsync": [vp, vp, c_size, c_int, c_int, vp, pvp],
        "gwAllReduceWeightedAsync": [vp, vp, c_size, c_int, c_double, vp, pvp],
        "gwReduceScatterAsync": [vp, vp, c_size, c_int, c_int, vp, pvp],
        "gwAllGatherAsync": [vp, vp, c_size, c_int, vp, pvp],
        "gwBroadcastAsync": [vp, vp, c_size, c_int, c_int, vp, pvp],
        "gwBarrierAsync": [vp, pvp],
        "gwTest": [vp, pint],
        "gwWait": [vp, c_int],
        "gwAllReduceInit": [vp, vp, c_size, c_int, c_int, vp, pvp],
        "gwAllReduceStream": [vp, vp, c_size, c_int, c_int, vp, vp],
        "gwReduceScatterStream": [vp, vp, c_size, c_int, c_int, vp, vp],
        "gwAllGatherStream": [vp, vp, c_size, c_int, vp, vp],
        "gwBroadcastStream": [vp, vp, c_size, c_int, c_int, vp, vp],
        "gwReduceStream": [vp, vp, c_size, c_int, c_int, c_int, vp, vp],
        "gwStart": [vp],
        "gwStartStream": [vp, vp],
        "gwRequestFree": [vp],
        "gwCommRegister": [vp, vp, c_size, pvp],
        "gwCommDeregister": [vp, vp],
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, c_int
    for name, args in (("gwGetErrorString", [c_int]), ("gwGetLastError", [vp])):
        f = getattr(lib, name)
        f.argtypes, f.restype = args, ctypes.c_char_p
    return lib
