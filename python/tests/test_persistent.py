"""Persistent all-reduce (Comm.allreduce_init over gwAllReduceInit / gwStart /
gwRequestFree) on real ranks under gwrun."""

import pytest

from conftest import WORKER, check_ok, gwrun


@pytest.mark.parametrize("n", [2, 3])
def test_persistent_rounds_misuse_and_free(n):
    check_ok(gwrun(n, WORKER, "persistent"), n, "OK persistent")
