"""gradwire.trace_span (gwTraceSpan): a Python program's compute on the
GW_TRACE timeline beside its collectives, on real ranks under gwrun."""

import json

from conftest import WORKER, check_ok, gwrun


def test_compute_spans_land_in_the_trace(tmp_path):
    path = tmp_path / "trace.json"
    check_ok(gwrun(2, WORKER, "trace", GW_TRACE=str(path)), 2, "OK trace")
    body = path.read_text()
    # Chrome's array format leaves the closing ] optional.
    events = json.loads(body.rstrip().rstrip(",") + "]")
    for rank in range(2):
        fwd = [e for e in events if e.get("ph") == "X" and e["pid"] == rank and e["name"] == "forward"]
        assert len(fwd) == 1, f"rank {rank}: {fwd}"
        assert fwd[0]["tid"] == 3 and fwd[0]["args"]["seq"] == 7
        assert 19_000 <= fwd[0]["dur"] < 10_000_000, fwd[0]
        assert any(e["pid"] == rank and e["name"] == "all_reduce" for e in events)
