"""Where the money goes, on tiny hand-built ladders of three models (a < b < c in price): a
cascade of pairs (round 1: a → b; round 2: b, repeated and paid once → c) and a ladder of
one-model steps (round t calls one model; its guide repeats its base). Per rung: the share of
questions on which its call is paid, on which its reply is returned, the spend, and the spend
on replies never returned; worked out by hand for each rollout kind."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccpo.evaluation.money import money_flow
from ccpo.traces.episodes import (
    build_episodes,
    conformal_rollout,
    point_rollout,
    single_rollout,
)
from ccpo.traces.io import parse_trace_line
from ccpo.traces.prices import prices_from_mapping
from ccpo.traces.rungs import rung_masks

PRICE = {"m-a": 1.0, "m-b": 10.0, "m-c": 100.0}  # USD per million tokens, in and out
PRICES = prices_from_mapping(
    {"as_of": "2026-01-01", "source": "illustrative prices of a test",
     "models": {m: {"input_usd_per_mtok": p, "output_usd_per_mtok": p} for m, p in PRICE.items()}}
)  # fmt: skip
CALL = {m: p * 2000 / 1e6 for m, p in PRICE.items()}  # one call: 1000 tokens in, 1000 out


def _step(model: str, answer: str, reused: bool = False, ok: bool = True) -> dict:
    n = 0 if reused else 1000
    return {"model": model, "answer": answer, "correct": ok, "reused": reused,
            "prompt": "cot", "usage": {"input_tokens": n, "output_tokens": n}}  # fmt: skip


def _trace(tid: str, rounds: list[tuple[dict, dict]]):
    rs = [{"round": t, "verdict_mode": "agree", "base": b, "guide": g}
          for t, (b, g) in enumerate(rounds, start=1)]  # fmt: skip
    line = {"schema": "ccpo.trace/v1", "id": tid, "task": "qa", "family": "short",
            "question": f"{tid}?", "gold": ["x"], "rounds": rs}  # fmt: skip
    return parse_trace_line(json.dumps(line))


def pairs(answers: list[tuple[str, str, str]]):
    """Episodes of a cascade of pairs; per question the replies of a, b and c ('' = none)."""
    return build_episodes(
        [_trace(f"q{i}", [(_step("m-a", a), _step("m-b", b)),
                          (_step("m-b", b, reused=True), _step("m-c", c))])
         for i, (a, b, c) in enumerate(answers)],
        PRICES,
    )  # fmt: skip


def one_model(n: int):
    """Episodes of a ladder of one-model steps a, b, c (every reply answers)."""
    steps = [(_step(m, m), _step(m, m, reused=True)) for m in ("m-a", "m-b", "m-c")]
    return build_episodes([_trace(f"q{i}", steps) for i in range(n)], PRICES)


def test_the_rungs_are_the_distinct_paid_calls_in_both_layouts():
    for ep in (pairs([("x", "x", "x")]), one_model(1)):
        assert ep.rungs is not None and ep.rungs.models == ("m-a", "m-b", "m-c")
        assert ep.rungs.cost[0] == pytest.approx([CALL["m-a"], CALL["m-b"], CALL["m-c"]])
    assert pairs([("x", "x", "x")]).rungs.steps == ((1, "base"), (1, "guide"), (2, "guide"))
    # a repeated step's reply is its original's rung
    assert pairs([("x", "x", "x")]).rungs.of_step[0].tolist() == [[0, 1], [1, 2]]
    assert one_model(1).rungs.of_step[0].tolist() == [[0, 0], [1, 1], [2, 2]]
    marked = np.zeros((1, 3, 2), dtype=bool)
    marked[0, 1, 1] = True  # round 2's repeat of b
    assert rung_masks(one_model(1).rungs.of_step, marked, 3).tolist() == [[False, True, False]]


def test_one_answer_on_a_cascade_of_pairs():
    """q0 stops at round 1 (b's reply), q1 at round 2 (c's), q2 at round 1 where b gave none
    (a's reply), q3 at round 2 where c gave none (round 2's base: b's reply, repeated)."""
    ep = pairs([("x", "x", "x"), ("x", "x", "x"), ("x", "", "x"), ("x", "x", "")])
    scores = np.array([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    m = single_rollout(ep, scores, 0.5)
    f = money_flow(ep, m)
    a, b, c = CALL["m-a"], CALL["m-b"], CALL["m-c"]
    assert f.paid.tolist() == [1.0, 1.0, 0.5]
    assert f.returned.tolist() == [0.25, 0.5, 0.25]
    assert f.spend == pytest.approx([a, b, c / 2])
    never = [a, a + b, b, a + c]  # per question, the paid calls whose reply is not returned
    assert f.unreturned_usd == pytest.approx(np.mean(never))
    assert f.unreturned == pytest.approx([a * 3 / 4, b * 2 / 4, c / 4])
    assert f.total_usd == pytest.approx(m.cost.mean()) == pytest.approx(f.spend.sum())
    assert f.unreturned_share == pytest.approx(np.mean(never) / m.cost.mean())
    assert f.other_usd == pytest.approx(0.0, abs=1e-15)


def test_one_answer_on_one_model_steps():
    """Each round is one call: stopping at round t pays rounds 1..t and returns round t's."""
    ep = one_model(3)
    scores = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    f = money_flow(ep, single_rollout(ep, scores, 0.5))
    a, b = CALL["m-a"], CALL["m-b"]
    assert f.paid == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert f.returned == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert f.unreturned_usd == pytest.approx((0 + a + (a + b)) / 3)


def test_a_set_returns_every_rung_whose_reply_is_a_member():
    """Both questions run both rounds; the set holds round 1's base and round 2's guide. q1's
    a gave no reply: an empty answer is never a member, so a is paid there, not returned."""
    ep = pairs([("x", "y", "z"), ("", "y", "z")])
    probs = np.zeros((2, 2, 3))
    probs[:, 0] = (0.9, 0.1, 0.8)  # round 1: base in, guide out, next in
    probs[:, 1] = (0.1, 0.9, 0.0)  # round 2: guide in
    m = conformal_rollout(ep, probs, 0.5)
    f = money_flow(ep, m)
    assert f.paid.tolist() == [1.0, 1.0, 1.0]
    assert f.returned.tolist() == [0.5, 0.0, 1.0]
    assert f.unreturned_usd == pytest.approx(CALL["m-b"] + CALL["m-a"] / 2)
    assert f.total_usd == pytest.approx(f.spend.sum())


def test_point_policies_and_evaluation_splits():
    """A point policy answering the base at round 1 pays a and b and returns a; over [K, n]
    evaluation splits the figures are the mean over every question drawn."""
    ep = pairs([("x", "x", "x")] * 4)
    idx = np.array([[0, 1], [2, 3], [0, 0]])
    acts = np.zeros((3, 2, 2), dtype=np.int64)  # base at round 1
    f = money_flow(ep, point_rollout(ep, acts, idx), idx)
    assert f.questions == 6
    assert f.paid.tolist() == [1.0, 1.0, 0.0] and f.returned.tolist() == [1.0, 0.0, 0.0]
    assert f.unreturned_usd == pytest.approx(CALL["m-b"])


def test_a_replay_that_does_not_say_has_no_money_flow():
    from dataclasses import replace

    ep = pairs([("x", "x", "x")])
    m = single_rollout(ep, np.ones((1, 2)), 0.5)
    assert money_flow(ep, replace(m, called=None)) is None
    assert money_flow(replace(ep, rungs=None), m) is None
