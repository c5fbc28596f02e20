"""Shared helpers: run a program under target/debug/gwrun with the repository's
libgradwire.so and this source tree's gradwire package."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
GWRUN = os.path.join(TARGET, "debug", "gwrun")
LIB = os.path.join(TARGET, "debug", "libgradwire.so")
HEADER = os.path.join(REPO, "capi", "include", "gradwire.h")
WORKER = os.path.join(HERE, "worker.py")
TRAIN = os.path.join(REPO, "examples", "python", "train_digits.py")


def _require_built():
    missing = [p for p in (GWRUN, LIB) if not os.path.isfile(p)]
    if missing:
        pytest.fail("missing " + ", ".join(missing) + ": run `cargo build --workspace --bins && cargo build -p gw-capi`")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    e["GRADWIRE_LIB"] = LIB
    e["GRADWIRE_HEADER"] = HEADER
    e["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["GW_TIMEOUT"] = "30"
    e.update(extra)
    return e


def run(argv, timeout=120, **extra):
    _require_built()
    p = subprocess.run(argv, env=env(**extra), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return p


def gwrun(n, *args, timeout=120, **extra):
    return run([GWRUN, "-n", str(n), sys.executable, *args], timeout=timeout, **extra)


def check_ok(p, n, tag="OK"):
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"exit {p.returncode}\n{out}"
    for r in range(n):
        assert f"[{r}] {tag}" in p.stdout, f"rank {r} did not print {tag!r}\n{out}"
