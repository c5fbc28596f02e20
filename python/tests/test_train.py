"""examples/python/train_digits.py: 4 ranks through gradwire equal one process."""

import re

import numpy as np
import pytest

from conftest import TRAIN, gwrun, run

import sys

STEPS = ["--steps", "300", "--global-batch", "128", "--lr", "0.5", "--seed", "0"]


def accuracy(p):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    m = re.search(r"test accuracy ([0-9.]+)", p.stdout)
    assert m, out
    return float(m.group(1))


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    f = tmp_path_factory.mktemp("single") / "single.npz"
    p = run([sys.executable, TRAIN, "--single", *STEPS, "--save", str(f)])
    return accuracy(p), np.load(f)


@pytest.fixture(scope="module")
def even(tmp_path_factory):
    f = tmp_path_factory.mktemp("even") / "even.npz"
    p = gwrun(4, TRAIN, *STEPS, "--save", str(f))
    assert "local batches [32, 32, 32, 32]" in p.stdout, p.stdout + p.stderr
    return accuracy(p), np.load(f)


def close(a, b):
    for k in ("W1", "b1", "W2", "b2"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-12, err_msg=k)


def test_single_process_reaches_accuracy(single):
    assert single[0] >= 0.93


def test_four_ranks_equal_single_process(single, even):
    acc, params = even
    assert acc >= 0.93
    close(params, single[1])


def test_uneven_local_batches_equal_even_split(tmp_path, single, even):
    f = tmp_path / "uneven.npz"
    p = gwrun(4, TRAIN, *STEPS, "--local-batches", "48,32,16,32", "--save", str(f))
    assert "local batches [48, 32, 16, 32]" in p.stdout, p.stdout + p.stderr
    assert accuracy(p) >= 0.93
    params = np.load(f)
    close(params, even[1])
    close(params, single[1])
