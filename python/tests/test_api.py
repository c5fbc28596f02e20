"""The gradwire Python API on real ranks under gwrun."""

import pytest

from conftest import WORKER, check_ok, gwrun


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("scenario", ["ops", "async", "errors"])
def test_scenario(scenario, n):
    check_ok(gwrun(n, WORKER, scenario), n, f"OK {scenario}")


def test_abort_from_another_thread_and_use_after_destroy():
    check_ok(gwrun(2, WORKER, "abort"), 2, "OK abort")


def test_avg_on_int32_message_reaches_python():
    """The C message of gwGetLastError is in the exception text (printed by the traceback)."""
    code = ("import numpy as np, gradwire\n"
            "c = gradwire.init()\n"
            "c.allreduce(np.ones(3, np.int32), op='avg')\n")
    p = gwrun(2, "-c", code)
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "gradwire.InvalidArgumentError: gwAllReduce: gwInvalidArgument:" in out, out
    assert "avg" in out and "int32" in out, out
