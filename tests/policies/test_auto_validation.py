"""``auto`` of one answer validates its candidates as ``train``'s calibration split will test
them (``like``: :func:`ccpo.policies.risk_control.passes`): on gold labels a strong
model's own misses make a few dozen questions' halves refuse by chance, which used to rule
every learned candidate out and ship ``always-<strongest>``. Tables are written by the tests
(illustrative, not LLM output)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ccpo.evaluation.harness import prices_for
from ccpo.policies.reference import certified
from ccpo.policies.risk_control import allowed_misses, passes
from ccpo.policies.single import RUN_ALL, validation_figures
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok
from tests.helpers.importing import math_table


def test_allowed_misses_per_test_and_size() -> None:
    assert allowed_misses(35, 0.2, None) == 6  # (6 + 1)/36 ≤ 0.2 < (7 + 1)/36
    assert allowed_misses(162, 0.2, None) == 31
    assert allowed_misses(56, 0.2, 0.1) == 6 and allowed_misses(56, 0.2, None) == 10
    assert allowed_misses(3, 0.2, None) == -1 and allowed_misses(0, 0.2, 0.1) == -1


def test_a_half_emulates_the_calibration_rate() -> None:
    # 40 questions; row j misses on j of them (a prefix: monotone along the sequence)
    losses = np.zeros((12, 40), dtype=bool)
    for j in range(12):
        losses[j, :j] = True
    # Learn-then-Test on 40 allows 4 misses; on 200 calibration questions 32 of 200 (16%),
    # i.e. 6.4 of 40
    assert allowed_misses(40, 0.2, 0.1) == 4 and allowed_misses(200, 0.2, 0.1) == 32
    got = passes(losses, 0.2, 0.1, 200)
    assert got.tolist() == [j <= 6 for j in range(12)]
    # the marginal test's losses are monotonised: a miss at θ_1 counts at every later θ
    wobbly = np.zeros((3, 40), dtype=bool)
    wobbly[1, :8] = True  # 8 misses at θ_1 only
    assert passes(wobbly, 0.2, 0.1, 200).tolist() == [True, False, True]
    assert passes(wobbly, 0.2, None, 200).tolist() == [True, False, False]
    # the reference's one rule: the same emulated rate
    assert certified(6, 40, 0.2, 0.1, like=200) and not certified(7, 40, 0.2, 0.1, like=200)
    assert not certified(5, 40, 0.2, 0.1)  # the binomial test on 40 itself: 4 at most
    assert certified(7, 40, 0.2, None) and not certified(8, 40, 0.2, None)  # (k + 1)/41


@pytest.fixture(scope="module")
def maths(tmp_path_factory):
    """A two-model maths ladder (gold labels) whose strong model misses on ~20%: seed 3."""
    folder = tmp_path_factory.mktemp("maths")
    table, _ = math_table(folder / "m.jsonl", n=300, seed=3, strong=0.8)
    out = folder / "t.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "gsm", "--family", "number",
            "--out", str(out))  # fmt: skip
    return out


def test_a_refused_half_runs_every_round_unless_the_whole_set_is_refused(maths) -> None:
    ep = build_episodes(read_traces(maths), prices_for(maths))
    sub = ep.subset(np.arange(60))
    rng = np.random.default_rng(0)
    scores = np.ones((sub.n, sub.horizon))
    scores[:, 0] = rng.random(sub.n)  # a stopping score with nothing to say
    alpha = 0.2
    # halves of 30 questions: some refuse under the plain marginal test (the strong model's
    # misses alone reach (k + 1)/31 > 0.2 there), so the candidate used to be out
    plain = validation_figures(sub, scores, alpha, None, seed=0)
    assert plain[0] == float("inf")
    cost, coverage, _ = validation_figures(sub, scores, alpha, None, seed=0, like=210)
    assert np.isfinite(cost) and coverage >= 1 - alpha - 0.1
    # never dearer than running every round (λ_0 = RUN_ALL, what a refused half is scored at)
    assert cost <= float(sub.round_cost.sum(-1).mean()) + 1e-12
    assert scores.max() < RUN_ALL  # λ_0 is above every score: it never stops early
    # a set the calibration itself would refuse stays out: a tiny α
    assert validation_figures(sub, scores, 0.02, None, seed=0, like=210)[0] == float("inf")


def test_auto_keeps_a_cascade_where_halves_refused_by_chance(maths, tmp_path: Path) -> None:
    pol = tmp_path / "p"
    ccpo_ok("train", "--traces", str(maths), "--answer", "single", "--alpha", "0.2",
            "--out", str(pol))  # fmt: skip
    summary = json.loads((pol / "summary.json").read_text())
    validation = summary["auto"]["validation"]
    assert summary["variant"] != "always-gpt-4o", validation
    assert np.isfinite(validation["cstop"]["cost_cents_per_question"]), validation
    # what it keeps costs less than the strong model alone on the calibration questions
    assert summary["cost_ratio_to_reference"] < 0.8, summary
    assert summary["calibration_coverage"] >= 0.8
