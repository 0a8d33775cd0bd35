"""Where the money goes on a ladder with a verify step, on a tiny hand-built ladder of three
calls (a < v < b in price): step 1 calls a; step 2 is v's verdict on a's reply (its base
repeats a's call, paid once); step 3 calls b. The verify step's rung is v's call: paid where
the step is run, never returned (a verdict is not a reply), so its spend is spend never
returned; stopping at it returns a's reply, a's rung. Worked out by hand for a single answer,
a set and a start at the verify step (a routed question: a's reply asked there, then v)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccpo.evaluation.money import money_flow
from ccpo.report.money import money_table, rung_table
from ccpo.traces.episodes import (
    Metrics,
    build_episodes,
    conformal_rollout,
    round_steps,
    single_rollout,
)
from ccpo.traces.io import parse_trace_line
from ccpo.traces.prices import prices_from_mapping

PRICE = {"m-a": 1.0, "m-v": 10.0, "m-b": 100.0}  # USD per million tokens, in and out
PRICES = prices_from_mapping(
    {"as_of": "2026-01-01", "source": "illustrative prices of a test",
     "models": {m: {"input_usd_per_mtok": p, "output_usd_per_mtok": p} for m, p in PRICE.items()}}
)  # fmt: skip
CALL = {m: p * 2000 / 1e6 for m, p in PRICE.items()}  # one call: 1000 tokens in, 1000 out
A, V, B = CALL["m-a"], CALL["m-v"], CALL["m-b"]


def _step(model: str, answer: str, ok: bool, reused: bool = False, prompt: str = "cot") -> dict:
    n = 0 if reused else 1000
    return {"model": model, "answer": answer, "correct": ok, "reused": reused,
            "prompt": prompt, "usage": {"input_tokens": n, "output_tokens": n}}  # fmt: skip


def _trace(i: int, a_ok: bool, yes: bool):
    """Question ``i``: a's reply (right iff ``a_ok``), v's verdict on it, b's reply (right)."""
    a = "x" if a_ok else "y"
    check = _step("m-v", a, a_ok, prompt="verify") | {"verdict": "yes" if yes else "no"}
    rounds = [
        ("agree", _step("m-a", a, a_ok), _step("m-a", a, a_ok, reused=True)),
        ("verify", _step("m-a", a, a_ok, reused=True), check),
        ("agree", _step("m-b", "x", True), _step("m-b", "x", True, reused=True)),
    ]
    rs = [{"round": t, "verdict_mode": mode, "base": b, "guide": g}
          for t, (mode, b, g) in enumerate(rounds, start=1)]  # fmt: skip
    line = {"schema": "ccpo.trace/v1", "id": f"q{i}", "task": "qa", "family": "short",
            "question": f"q{i}?", "gold": ["x"], "rounds": rs}  # fmt: skip
    return parse_trace_line(json.dumps(line))


def ladder(n: int = 3):
    return build_episodes([_trace(i, i % 2 == 0, i % 2 == 0) for i in range(n)], PRICES)


def test_a_verify_steps_rung_is_its_verifiers_call_whose_reply_is_the_verified_one():
    ep = ladder(1)
    r = ep.rungs
    assert r.models == ("m-a", "m-v", "m-b") and r.steps == ((1, "base"), (2, "guide"), (3, "base"))
    assert r.cost[0] == pytest.approx([A, V, B])
    assert r.verifies == ("", "m-a", "")
    # the call each step stands for: the verify step's base is a's call, its guide v's
    assert r.of_step[0].tolist() == [[0, 0], [0, 1], [2, 2]]
    # the reply each step returns: the verify step's guide returns a's reply
    assert r.replies[0].tolist() == [[0, 0], [0, 0], [2, 2]]
    assert r.label(1) == "m-v (step 2, verifies m-a)" and r.label(2) == "m-b (step 3)"
    assert r.subset(np.array([0, 0])).replies.shape == (2, 3, 2)


def test_one_answer_stopping_at_the_verify_step_returns_the_verified_reply():
    """q0 stops at step 1 (a), q1 at the verify step (a's reply after v's yes), q2 at step 3
    (b): a is paid everywhere, v on q1 and q2, b on q2; v's reply is never returned."""
    ep = ladder(3)
    scores = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    m = single_rollout(ep, scores, 0.5)
    assert m.returned[1, 1, 1]  # the single answer at a verify step is its guide's step
    f = money_flow(ep, m)
    assert f.paid == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert f.returned == pytest.approx([2 / 3, 0.0, 1 / 3])
    assert f.spend == pytest.approx([A, V * 2 / 3, B / 3])
    assert f.unreturned == pytest.approx([A / 3, V * 2 / 3, 0.0])  # q2's a; every verdict
    assert f.verdict_usd == pytest.approx(V * 2 / 3)
    assert f.total_usd == pytest.approx(m.cost.mean()) == pytest.approx(f.spend.sum())
    js = f.to_json()
    assert js["rungs"][1]["verifies"] == "m-a" and "verifies" not in js["rungs"][0]
    assert js["verdict_usd_per_question"] == pytest.approx(V * 2 / 3)


def test_a_set_with_a_verify_step_returns_the_verified_reply_once():
    """Every question runs all three steps; the set holds the verify step's answer (a's
    reply) and b's: rungs a and b are returned, v is paid and never returned."""
    ep = ladder(2)
    probs = np.zeros((2, 3, 3))
    probs[:, 0] = (0.1, 0.1, 0.9)  # step 1: go on
    probs[:, 1] = (0.1, 0.9, 0.9)  # the verify step: its answer in, go on
    probs[:, 2] = (0.9, 0.1, 0.0)  # step 3: b's answer in
    m = conformal_rollout(ep, probs, 0.5)
    f = money_flow(ep, m)
    assert f.paid.tolist() == [1.0, 1.0, 1.0]
    assert f.returned.tolist() == [1.0, 0.0, 1.0]
    assert f.unreturned_usd == pytest.approx(V)


def test_a_start_at_the_verify_step_pays_the_reply_there_then_the_verifier():
    """A routed question started at step 2 skips step 1: a's reply is asked at the verify
    step (its cost in the routed view), then v; the rungs say a and v are paid, a returned,
    and account for the view's whole cost."""
    ep = ladder(2)
    assert ep.routes is not None
    cost = ep.routes.cost[1]  # [N, T] started at step 2
    assert cost[:, 1] == pytest.approx([A + V, A + V]) and (cost[:, 0] == 0).all()
    ran = np.array([[False, True, False]] * 2)
    returned = np.zeros((2, 3, 2), dtype=bool)
    returned[:, 1, 1] = True
    m = Metrics(cost=(cost * ran).sum(-1), covered=np.ones(2, bool), length=np.ones(2, int),
                set_size=np.ones(2, int), called=round_steps(ran), returned=returned)  # fmt: skip
    f = money_flow(ep, m)
    assert f.paid.tolist() == [1.0, 1.0, 0.0] and f.returned.tolist() == [1.0, 0.0, 0.0]
    assert f.spend.sum() == pytest.approx(f.total_usd) == pytest.approx(A + V)


def test_reports_name_the_verifier():
    from ccpo.evaluation.harness import ResultRow

    ep = ladder(3)
    f = money_flow(ep, single_rollout(ep, np.array([[0.0, 1.0, 1.0]] * 3), 0.5)).to_json()
    assert rung_table(f).rows[1][0] == "2. m-v (round 2 verifies 1)"
    row = ResultRow("cstop-single", 1.0, 0.9, 2.0, 1.0, [1.0], [0.9], money=f)
    assert money_table([row], 3).headers[1:4] == ["1. m-a", "2. m-v (verifier)", "3. m-b"]
