"""How the package reads device arrays (`__cuda_array_interface__`), the
part that needs no GPU: shape, dtype, pointer and contiguity come from the
interface, and streams from torch, CuPy or a raw handle. The calls on real
CUDA tensors run in the GPU check (scripts/gpu/gpu_collectives.py,
check_python_api)."""
import ctypes
import os
import sys

import numpy as np
import pytest

from conftest import HEADER, LIB, REPO

# This source tree's package and library, not an installed copy.
sys.path.insert(0, os.path.join(REPO, "python"))
os.environ.setdefault("GRADWIRE_LIB", LIB)
os.environ.setdefault("GRADWIRE_HEADER", HEADER)
import gradwire  # noqa: E402


class Iface:
    """An object that presents memory the way CuPy and torch do."""

    def __init__(self, shape, typestr, ptr, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": strides}


def test_a_contiguous_device_array_is_read_from_its_interface():
    d = gradwire._send(Iface((4, 5), "<f4", 0x7F0000001000))
    assert isinstance(d, gradwire._Dev)
    assert d.shape == (4, 5) and d.size == 20 and d.ndim == 2
    assert d.dtype == np.float32
    assert gradwire._ptr(d).value == 0x7F0000001000
    # Explicit C strides are contiguous too; a scalar is one element.
    assert gradwire._Dev(Iface((4, 5), "<f8", 8, strides=(40, 8))).size == 20
    assert gradwire._Dev(Iface((), "<i4", 8)).shape == (1,)


def test_a_strided_device_array_is_refused_by_name():
    with pytest.raises(ValueError, match="C-contiguous"):
        gradwire._Dev(Iface((4, 5), "<f4", 8, strides=(4, 16)))


def test_an_out_array_of_the_wrong_size_or_type_is_refused():
    with pytest.raises(ValueError, match="out has 6 elements"):
        gradwire._recv(Iface((6,), "<f4", 8), (5,), np.float32, "allreduce")
    with pytest.raises(TypeError, match="out has dtype float64"):
        gradwire._recv(Iface((5,), "<f8", 8), (5,), np.float32, "allreduce")
    ok = gradwire._recv(Iface((5,), "<f4", 8), (5,), np.float32, "allreduce")
    assert isinstance(ok, gradwire._Dev)


def test_streams_come_from_torch_cupy_or_a_raw_handle():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 5678

    assert gradwire._stream_handle(TorchLike()).value == 1234
    assert gradwire._stream_handle(CupyLike()).value == 5678
    assert gradwire._stream_handle(42).value == 42
    assert isinstance(gradwire._stream_handle(0), ctypes.c_void_p)


def test_host_arrays_still_go_the_numpy_way():
    a = gradwire._send([1.0, 2.0])
    assert isinstance(a, np.ndarray)
    assert gradwire._result(a) is a
