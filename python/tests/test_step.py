"""comm.step_begin() / comm.step_end() over gwStepBegin / gwStepEnd: the struct
layout read from gradwire.h, the error without a job server, and a run of
steps against a minimal job server (http.server) speaking the JSON contract."""

import ctypes
import http.server
import json
import os
import sys
import textwrap
import threading

from conftest import HEADER, REPO, run

sys.path.insert(0, os.path.join(REPO, "python"))
from gradwire import _header, _step  # noqa: E402  (no library needed)

# A one-rank communicator needs no launcher.
PRELUDE = "import gradwire\nc = gradwire.init_rank(1, gradwire.get_unique_id(), 0)\n"


def test_structs_are_built_from_the_header():
    _, defines = _header.load(HEADER)
    info, rep = _step.build(HEADER, defines)
    names = [f for f, _ in info._fields_]
    assert names == ["step", "global_batch", "local_batch", "offset", "weight", "algo",
                     "predicted_step_s"]
    assert ctypes.sizeof(info) == 8 * 5 + 16 + 8
    assert [f for f, _ in rep._fields_] == ["samples", "compute_s", "comm_s", "step_s",
                                           "local_grad_sq", "global_grad_sq"]
    assert ctypes.sizeof(rep) == 8 * 6


def test_struct_parser_uses_defines_and_skips_foreign_structs():
    text = textwrap.dedent("""
        #define N 4
        typedef struct { uint64_t a; /* doc; with semicolon */ char name[N]; double d; } s_t;
        typedef struct { struct other *p; } skip_t;
        """)
    got = _step.parse_structs(text, {"N": 4})
    assert [f for f, _ in got["s_t"]] == ["a", "name", "d"]
    assert "skip_t" not in got


def test_step_begin_without_a_job_server_says_why():
    code = PRELUDE + textwrap.dedent("""
        try:
            c.step_begin()
        except gradwire.InvalidUsageError as e:
            print("RAISED", e)
        """)
    p = run([sys.executable, "-c", code])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RAISED gwStepBegin: gwInvalidUsage:" in p.stdout, p.stdout + p.stderr
    assert "GW_JOB_SERVER is not set" in p.stdout


def test_a_job_server_that_stays_down_is_a_timeout():
    code = PRELUDE + textwrap.dedent("""
        try:
            c.step_begin()
        except TimeoutError as e:
            print("RAISED", e)
        """)
    p = run([sys.executable, "-c", code], GW_JOB_SERVER="http://127.0.0.1:9", GW_JOB_ID="j",
            GW_JOB_TOKEN="t", GW_JOB_RETRY_S="0.3")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RAISED gwStepBegin: gwTimeout: job server http://127.0.0.1:9 gone for" in p.stdout, \
        p.stdout + p.stderr


def _reply(handler, out):
    data = json.dumps(out).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _JobServer(http.server.BaseHTTPRequestHandler):
    """Job j3, one rank with local batch 5 of 20; says stop when step 1 ends."""

    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, self.headers["Authorization"], body))
        if self.path == "/v1/jobs/j3/step/begin":
            out = {"step": body["step"], "global_batch": 20, "local_batch": 5, "offset": 15,
                   "weight": 0.25, "algo": "tree", "predicted_step_s": 0.125}
        elif self.path == "/v1/jobs/j3/step/end":
            out = {"stop": body["step"] >= 1}
        else:
            self.send_error(404)
            return
        _reply(self, out)

    def log_message(self, *args):
        pass


def test_steps_follow_the_server_until_it_says_stop():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JobServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code = PRELUDE + textwrap.dedent("""
            while True:
                s = c.step_begin()
                print("STEP", s.step, s.global_batch, s.local_batch, s.offset, s.weight, s.algo,
                      s.predicted_step_s)
                if c.step_end(s.local_batch, 0.5, 0.125, 0.75, local_grad_sq=2.0):
                    break
            print("STOPPED")
            """)
        p = run([sys.executable, "-c", code], GW_JOB_SERVER=f"http://127.0.0.1:{srv.server_port}",
                GW_JOB_ID="j3", GW_JOB_TOKEN="tok3")
    finally:
        srv.shutdown()
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "STEP 0 20 5 15 0.25 tree 0.125" in p.stdout, out
    assert "STEP 1 20 5 15 0.25 tree 0.125" in p.stdout, out
    assert "STOPPED" in p.stdout and "STEP 2" not in p.stdout, out
    seen = _JobServer.seen
    assert [path.rsplit("/", 1)[1] for path, _, _ in seen] == ["begin", "end", "begin", "end"]
    assert all(auth == "Bearer tok3" for _, auth, _ in seen)
    end = seen[1][2]
    assert end == {"rank": 0, "step": 0, "samples": 5, "compute_s": 0.5, "comm_s": 0.125,
                   "step_s": 0.75, "local_grad_sq": 2.0, "global_grad_sq": None}


class _PreemptingServer(http.server.BaseHTTPRequestHandler):
    """Job j4: plans step 1, and answers step 2's begin with "checkpoint" (the
    scheduling policy takes the job off its nodes there)."""

    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path.rsplit("/", 1)[1], body["step"]))
        out = {"step": body["step"], "global_batch": 8, "local_batch": 8, "offset": 0,
               "weight": 1.0, "algo": "auto"}
        if self.path.endswith("/begin") and body["step"] == 2:
            out["checkpoint"] = True
        elif self.path.endswith("/end"):
            out = {"stop": False}
        _reply(self, out)

    def log_message(self, *args):
        pass


def test_a_resumed_worker_starts_at_its_step_and_a_preempted_one_learns_where_to_resume():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PreemptingServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code = PRELUDE + textwrap.dedent("""
            print("RESUME", gradwire.resume_step())
            try:
                while True:
                    s = c.step_begin()
                    print("STEP", s.step)
                    c.step_end(s.local_batch, 0.1, 0.1, 0.2)
            except gradwire.PreemptedError as e:
                print("PREEMPTED", e.step, e.code_name, e.message)
            """)
        p = run([sys.executable, "-c", code], GW_JOB_SERVER=f"http://127.0.0.1:{srv.server_port}",
                GW_JOB_ID="j4", GW_JOB_TOKEN="tok4", GW_RESUME_STEP="1")
    finally:
        srv.shutdown()
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "RESUME 1" in p.stdout and "STEP 1" in p.stdout and "STEP 0" not in p.stdout, out
    assert "PREEMPTED 2 gwPreempted job j4 is preempted at step 2" in p.stdout, out
    assert _PreemptingServer.seen == [("begin", 1), ("end", 1), ("begin", 2)]


def test_resume_step_reads_gw_resume_step():
    assert _step.resume_step(None) == 0
    assert _step.resume_step(" ") == 0
    assert _step.resume_step(" 12 ") == 12
    for bad in ("-1", "x", "1.5"):
        try:
            _step.resume_step(bad)
        except ValueError as e:
            assert "GW_RESUME_STEP" in str(e) and bad in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted")
