"""Persistent all-reduce (Comm.allreduce_init over gwAllReduceInit / gwStart /
gwRequestFree) on real ranks under gwrun."""

import pytest

from conftest import WORKER, check_ok, gwrun


@pytest.mark.parametrize("n", [2, 3])
def test_persistent_rounds_misuse_and_free(n):
    check_ok(gwrun(n, WORKER, "persistent"), n, "OK persistent")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_registered_arrays_misuse_and_deregister(n):
    """Comm.register (gwCommRegister): calls on views of it, deregistering after a
    call not waited for, refusals."""
    check_ok(gwrun(n, WORKER, "register"), n, "OK register")
