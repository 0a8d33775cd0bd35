"""Feedback that says "unanswerable" and drift you can see: ``ccpo serve`` under uvicorn on
127.0.0.1 against the scripted LLM server (real HTTP)."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from ccpo.runtime.feedback import DRIFT_MIN
from tests.helpers.serve import FEEDBACK_UNLIMITED, LiveServer, make_service, state_at

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def _answer_and_tell(http: httpx.Client, i: int, feedback: dict) -> dict:
    s = http.post("/v1/answer", json={"question": f"{Q} v{i}", "id": f"q{i}"}).json()
    f = http.post("/v1/feedback", json={"id": s["id"], **feedback})
    assert f.status_code == 200, f.text
    return f.json()


def test_unanswerable_counts_as_covered_and_moves_kappa_up(
    world, policy_dir, prices_path, tmp_path
):
    conf = {"adapt_kappa": True, "kappa_min_feedback": 0, "feedback_per_minute": FEEDBACK_UNLIMITED,
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
    conf = {"feedback_per_minute": FEEDBACK_UNLIMITED}
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


def test_a_policy_with_calibration_scores_moves_kappa_along_them(world, prices_path, tmp_path):
    """A policy calibrated by ccpo (its calibration scores kept in policy.json) is served with
    the level tracker: every κ ``serve`` reports after a feedback is Q(u) of those scores,
    the κ the runtime's own step (:func:`ccpo.runtime.feedback.apply_feedback`) gives in
    process on the same feedback, and /metrics reports the band in κ units."""
    import numpy as np

    from ccpo.policies.registry import load_policy, stopping_fitter
    from ccpo.runtime.config import ServerConfig
    from ccpo.runtime.feedback import Counters, apply_feedback, online_kappa
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.prices import load_prices
    from ccpo.traces.sim import SimConfig, generate

    prices = load_prices()
    ep = build_episodes(generate(SimConfig(n=300, seed=0)), prices)
    pol = stopping_fitter("cstop")(ep, np.arange(200), 0.1, 0)
    pol.prices = prices.to_price_file()
    pol.calibrate(ep, np.arange(200, 300))
    folder = pol.save(tmp_path / "cal-policy")
    loaded = load_policy(folder)
    assert loaded.calibration == pol.calibration and loaded.calibration.n == 100
    assert loaded.calibration.kappa(0.1) == loaded.kappa

    conf = {"adapt_kappa": True, "kappa_min_feedback": 0, "kappa_eta0": 0.5,
            "feedback_per_minute": FEEDBACK_UNLIMITED,
            "state": state_at(tmp_path, "s.db")}  # fmt: skip
    svc = make_service(folder, world, prices_path, conf)
    told = [{"none_of_them": True}] * 6 + [{"unanswerable": True}] * 4
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        served = [_answer_and_tell(http, i, fb)["kappa"] for i, fb in enumerate(told)]
        m = http.get("/metrics.json").json()
    cfg = ServerConfig(**{k: v for k, v in conf.items() if k != "state"})
    tr, bounds = online_kappa(loaded.kappa, 0.1, 0.05, 0.1, cfg, loaded.calibration)
    c, expect = Counters(), []
    for fb in told:
        apply_feedback(tr, c, "unanswerable" in fb, True, cfg.kappa_max_step, bounds)
        expect.append(tr.kappa)
    assert served == expect
    assert served[5] < loaded.kappa  # six misses lowered κ to a lower calibration score
    assert all(k in (*loaded.calibration.below, 0.0, 1.0) for k in served)
    assert m["kappa_level"] == tr.level and loaded.calibration.kappa(tr.level) == served[-1]
    assert m["kappa_lower"] == loaded.calibration.kappa(0.0)
    assert m["kappa_upper"] == loaded.calibration.kappa(0.2)
