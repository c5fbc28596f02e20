"""PyTorch's c10d backend "gradwire" (gradwire.torch) on real ranks: every
collective checked exactly at 2 and 4 ranks, DDP equal to Gloo and to one
process on the global batch, the weighted hook with uneven local batches,
FSDP2, torchrun and an explicit store, DDP under a real gwjob server and
agent following its step plan, and the error paths."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO, TARGET, check_ok, env, gwrun, run

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


# torch's Gloo can abort a rank at exit, after training is done and saved
# ("terminate called without an active exception": a C++ thread torn down in
# Gloo's shutdown). Seen once, in a full suite run on 2026-12-04; it is Gloo's,
# so only the Gloo baseline run is retried, once, and only on that signature.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def test_ddp_equals_gloo_and_one_process(tmp_path):
    saved = {}
    for backend in ("gradwire", "gloo"):
        out = tmp_path / f"{backend}.pt"
        p = gwrun(4, EXAMPLE, "--backend", backend, "--save", str(out), timeout=300)
        if backend == "gloo" and p.returncode != 0 and GLOO_TEARDOWN_ABORT in p.stdout + p.stderr:
            print("the Gloo baseline aborted in teardown; running it again:\n" + p.stderr[-2000:])
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


GWJOB = os.path.join(TARGET, "debug", "gwjob")


class _Proc:
    """A gwjob process whose output goes to a file, killed at the end."""

    def __init__(self, argv, log, e):
        self.log = log
        self.p = subprocess.Popen(argv, env=e, cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=open(log, "w"), stderr=subprocess.STDOUT)

    def text(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        self.p.kill()
        self.p.wait()


def _wait_for(what, get, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        v = get()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_ddp_under_gwjob_follows_the_job_servers_plan(tmp_path):
    # A real job server and one agent with two slots; the example submitted
    # as a 2-worker OptPerf job, its rank 1 made slower per sample. Each step
    # takes its local batch, offset and weight from the server's plan
    # (hooks.StepPlan) and reports its time back; the parameters must still
    # equal one process on the same global batches.
    e = env(GW_ADMIN_TOKEN="torch-test-admin-token")
    server = _Proc([GWJOB, "serve", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "db")],
                   tmp_path / "server.log", e)
    agent = None
    try:
        line = _wait_for("gwjob serve to listen", lambda: next(
            (l for l in server.text().splitlines() if l.startswith("gwjob: listening on ")), None))
        url = line.split()[-1]
        agent = _Proc([GWJOB, "agent", "--server", url, "--node", "n1", "--rack", "r1",
                       "--slots", "2", "--device-type", "cpu"], tmp_path / "agent.log", e)
        _wait_for("the agent to register", lambda: "registered node n1" in agent.text())
        saved = tmp_path / "planned.pt"
        sub = subprocess.run(
            [GWJOB, "submit", "--server", url, "--workers", "2", "--global-batch", "64",
             "--batch-bounds", "4:60", "--planner", "optperf", "--", sys.executable, EXAMPLE,
             "--steps", "30", "--slow-rank", "1", "--slow-ms-per-sample", "4", "--save", str(saved)],
            env=e, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        job_id = sub.stdout.strip()

        def ended():
            st = subprocess.run([GWJOB, "status", "--server", url, "--json", job_id], env=e,
                                capture_output=True, text=True, timeout=30)
            state = json.loads(st.stdout)["state"] if st.returncode == 0 else None
            return state if state in ("succeeded", "failed", "cancelled") else None

        state = _wait_for(f"job {job_id} to end", ended, limit=240)
        out = agent.text()
        assert state == "succeeded", out + server.text()
        assert "largest difference from one process on the global batch" in out, out
        local = {}
        for r in (0, 1):
            l = next(l for l in out.splitlines() if f"rank {r} local batches [" in l)
            local[r] = json.loads(l.split("local batches ", 1)[1])
        assert len(local[0]) == len(local[1]) == 30, local
        assert all(a + b == 64 for a, b in zip(local[0], local[1])), local
        # OptPerf moved samples from the slow rank to the fast one (after its
        # warm-up; judged over the last third, since a step's timing is noisy).
        late = slice(20, 30)
        assert sum(local[0][late]) > sum(local[1][late]), local
        print("local batches by rank:", local)
        assert saved.exists()
    finally:
        if agent is not None:
            agent.stop()
        server.stop()


def test_job_init_outside_gwjob_says_so():
    code = ("from gradwire.torch import job\n"
            "try:\n    job.init_process_group()\n"
            "except RuntimeError as e:\n    print('RAISED', e)\n")
    p = run([sys.executable, "-c", code])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RAISED gradwire.torch.job.init_process_group: GW_JOB_SERVER and GW_STORE are not set" in p.stdout, \
        p.stdout + p.stderr
