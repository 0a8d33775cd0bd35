"""Feedback that says "unanswerable" and drift you can see (issue 31, items 4-5): ``ccpo serve``
under uvicorn on 127.0.0.1 against the scripted LLM server (real HTTP)."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from ccpo.runtime.feedback import DRIFT_MIN

from .conftest import LiveServer, make_service, state_at

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def _answer_and_tell(http: httpx.Client, i: int, feedback: dict) -> dict:
    s = http.post("/v1/answer", json={"question": f"{Q} v{i}", "id": f"q{i}"}).json()
    f = http.post("/v1/feedback", json={"id": s["id"], **feedback})
    assert f.status_code == 200, f.text
    return f.json()


def test_unanswerable_counts_as_covered_and_moves_kappa_up(
    world, policy_dir, prices_path, tmp_path
):
    conf = {"adapt_kappa": True, "kappa_min_feedback": 0, "feedback_per_minute": None,
            "state": state_at(tmp_path, "s.db")}  # fmt: skip
    svc = make_service(policy_dir, world, prices_path, conf)
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        k0 = http.get("/metrics.json").json()["kappa"]
        got = [_answer_and_tell(http, i, {"unanswerable": True}) for i in range(3)]
        both = http.post(
            "/v1/feedback", json={"id": "q0", "unanswerable": True, "none_of_them": True}
        )
        m = http.get("/metrics.json").json()
    assert [g["covered"] for g in got] == [True] * 3
    assert got[0]["kappa"] > k0  # a covered step: κ rises by η·α
    assert m["coverage"] == 1.0 and m["feedback"] == 3
    assert both.status_code == 422 and "exactly one of" in both.text


def test_metrics_show_recent_coverage_against_its_target_and_serve_warns(
    world, policy_dir, prices_path, caplog
):
    """Every answer missed: drift is judged from DRIFT_MIN = 50 feedbacks on (0 of 50 is far
    below 0.9), warned once in the log, and shown in /metrics."""
    conf = {"feedback_per_minute": None}
    svc = make_service(policy_dir, world, prices_path, conf)
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        with caplog.at_level(logging.WARNING, logger="ccpo.serve"):
            for i in range(DRIFT_MIN - 1):
                _answer_and_tell(http, i, {"none_of_them": True})
            quiet = [r for r in caplog.records if "below the target" in r.getMessage()]
            before = http.get("/metrics.json").json()
            for i in range(DRIFT_MIN - 1, DRIFT_MIN + 5):
                _answer_and_tell(http, i, {"none_of_them": True})
        m = http.get("/metrics.json").json()
        text = http.get("/metrics").text
    warned = [r for r in caplog.records if "below the target" in r.getMessage()]
    assert not quiet and not before["coverage_short"] and before["recent_feedback"] == 49
    assert m["coverage_target"] == pytest.approx(1 - m["alpha"])
    assert m["recent_coverage"] == 0.0 and m["recent_feedback"] == 55 and m["coverage_short"]
    assert len(warned) == 1  # once when it starts, not once per feedback
    assert "ccpo check" in warned[0].getMessage()
    assert "ccpo_coverage_target" in text and "ccpo_recent_coverage" in text
    assert re.search(r"^ccpo_coverage_short\{[^}]*\} 1\.0$", text, re.M)
