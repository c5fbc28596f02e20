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
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
