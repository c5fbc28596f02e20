"""PyTorch's c10d backend "gradwire" (gradwire.torch) on real ranks: every
collective checked exactly at 2 and 4 ranks, DDP equal to Gloo and to one
process on the global batch, the weighted hook with uneven local batches,
FSDP2, torchrun and an explicit store, and the error paths."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, check_ok, env, gwrun

if os.environ.get("GW_TEST_TORCH") == "required":
    import torch  # scripts/test.sh installed it: a failure to import is a failure
else:
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/python-deps.sh installs it)")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")
EXAMPLE = os.path.join(REPO, "examples", "torch", "train_ddp.py")


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_exactly(n):
    check_ok(gwrun(n, WORKER, "collectives", timeout=300), n, "OK collectives")


def test_errors_name_the_problem_and_mismatches_raise_on_every_rank():
    p = gwrun(2, WORKER, "errors", timeout=120)
    check_ok(p, 2, "OK errors")
    for r in range(2):
        assert f"[{r}] mismatch raised:" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("n", [2, 3, 4])
def test_send_recv(n):
    check_ok(gwrun(n, WORKER, "p2p", timeout=120), n, "OK p2p")


def test_a_dead_rank_raises_on_the_others():
    p = gwrun(3, WORKER, "killed", timeout=120, GW_TIMEOUT="60")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(2):
        line = next((l for l in p.stdout.splitlines() if l.startswith(f"[{r}] raised after")), None)
        assert line is not None, out
        assert "rank 2" in line, line
        assert float(line.split()[3]) < 30, f"not well within GW_TIMEOUT=60: {line}"


def test_explicit_store():
    check_ok(gwrun(2, WORKER, "store"), 2, "OK store")


def test_fsdp_equals_one_process():
    check_ok(gwrun(2, WORKER, "fsdp", timeout=300), 2, "OK fsdp")


def test_ddp_equals_gloo_and_one_process(tmp_path):
    saved = {}
    for backend in ("gradwire", "gloo"):
        out = tmp_path / f"{backend}.pt"
        p = gwrun(4, EXAMPLE, "--backend", backend, "--save", str(out), timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "largest difference from one process" in p.stdout, p.stdout
        saved[backend] = torch.load(out)
    for a, b in zip(saved["gradwire"], saved["gloo"]):
        assert (a - b).abs().max().item() <= 1e-5


def test_weighted_hook_with_uneven_batches():
    p = gwrun(2, EXAMPLE, "--uneven", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "local batches [21, 43]" in p.stdout, p.stdout


def test_under_torchrun():
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            EXAMPLE, "--steps", "10"]
    p = subprocess.run(argv, env=env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "gradwire: 2 ranks" in p.stdout and "largest difference" in p.stdout, p.stdout
