"""A ladder with verify steps through every rollout, where the money goes, and Pareto-tested
routing. The 4-model table (SYNTHETIC, label-free: agreement with big-m; seed 3) imported as
one model per step with mid-m verifying tiny-m's and small-m's replies (verdicts SIMULATED at
accuracy 0.85): T = 6 rounds, six rungs, two of them mid-m's verdicts.

- For a single answer, a routed single answer calibrated by Pareto testing, a set, a routed
  set, ``always-<reference>`` and ``prompt-router``: per question the spend on the rungs paid
  equals the replay's cost, a returned rung is a paid one, and a verdict's rung is never
  returned (stopping at a verify step returns the verified reply).
- The held-out guarantee of the Pareto-tested routed policy (τ̂ and λ̂ certified together on
  one fixed sequence): fitted on 300 questions (seed 0), calibrated on 350 and scored on the
  350 others over 100 random splits (seed 1), α = 0.2, δ = 0.1. A split counts as over only
  past α + 2 SE (SE ≤ √(α(1 − α)/350) ≈ 0.021); at most δ + 0.05 of the splits may be over.
  The same splits at λ = 0 (stop at the first round run) break it, so the test can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.evaluation.harness import load_episodes, make_splits
from ccpo.evaluation.money import money_flow
from ccpo.evaluation.prompt_router import PromptRouterRow
from ccpo.learning.config import StopConfig
from ccpo.policies.reference import ReferencePolicy
from ccpo.policies.registry import fit_policy
from ccpo.traces.rungs import rung_masks
from tests.helpers.routing import (
    held_out_splits,
    imported_ladder,
    over_share,
    routed_on_held_out,
)

ALPHA, DELTA, N_TRAIN, SPLITS = 0.2, 0.1, 300, 100
VERIFY = ("--verifier", "mid-m", "--verify-after", "tiny-m,small-m", "--simulate-verifier", "0.85")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return imported_ladder(tmp_path_factory.mktemp("verify"), 1000, 3, "one", *VERIFY)


@pytest.fixture(scope="module")
def fitted(traces):
    path, prices = traces
    ep, _ = load_episodes(path, [str(prices)])
    train, cal = np.arange(0, 600, 2), np.arange(1, 600, 2)
    pols = {
        "single": fit_policy("cstop-lr", ep, train, ALPHA, 0, single=True),
        "routed single": fit_policy("cstop-lr", ep, train, ALPHA, 0, single=True, routed=True),
        "set": fit_policy("cstop", ep, train, ALPHA, 0),
        "routed set": fit_policy("cstop", ep, train, ALPHA, 0, routed=True),
        "reference": ReferencePolicy.fit(ep, "single", StopConfig(alpha=ALPHA)),
    }
    for pol in pols.values():
        pol.calibrate(ep, cal)
    return ep, pols


def _accounted(ep, m, name: str, idx=slice(None)) -> np.ndarray:
    """The rungs [..., R] the replay ``m`` returns; asserts that the rungs it pays account
    for its cost, that it returns only rungs it pays, and never a verdict's."""
    R = ep.rungs.count
    paid = rung_masks(ep.rungs.of_step[idx], m.called, R)
    ret = rung_masks(ep.rungs.replies[idx], m.returned, R)
    cost = (paid * ep.rungs.cost[idx]).sum(-1)
    np.testing.assert_allclose(cost, m.cost, rtol=1e-12, err_msg=name)
    assert not (ret & ~paid).any(), name
    verdicts = np.array([bool(v) for v in ep.rungs.verifies])
    assert not ret[..., verdicts].any(), name
    return ret


def test_every_rollout_pays_the_rungs_it_runs_and_returns_no_verdict(fitted) -> None:
    ep, pols = fitted
    assert ep.horizon == 6 and ep.verify_rounds == (1, 3)
    assert ep.rungs.verifies == ("", "tiny-m", "", "small-m", "", "")
    assert ep.rungs.models == ("tiny-m", "mid-m", "small-m", "mid-m", "mid-m", "big-m")
    assert pols["routed single"].sequence is not None  # Pareto testing certified (τ̂, λ̂)
    stops = late = 0  # single answers returned at a verify step; routed starts after round 1
    for name, pol in pols.items():
        m = pol.rollout(ep, pol.episode_scores(ep), pol.threshold)
        ret = _accounted(ep, m, name)
        if pol.answer == "single":
            assert (ret.sum(-1) == 1).all(), name  # one reply, never a verdict
            stops += int(m.returned[:, ep.verify_rounds].any((-1, -2)).sum())
        late += int((m.called.any(-1).argmax(-1) > 0).sum()) if "routed" in name else 0
        f = money_flow(ep, m)
        assert f.total_usd == pytest.approx(f.spend.sum(), rel=1e-12), name
        assert f.verdict_usd == pytest.approx(f.spend[[1, 3]].sum()), name
    assert stops >= 50 and late >= 50  # verify steps and routing are in play


def test_prompt_router_pays_the_reply_a_verify_rung_verifies(traces) -> None:
    path, prices = traces
    ep, _ = load_episodes(path, [str(prices)])
    splits = make_splits(ep.n, (300, 300, 300), 4, 0)
    row = PromptRouterRow()
    row.fit(ep, splits.train, ALPHA, 0)
    m = row.evaluate(ep, splits, ALPHA, 0)
    ret = _accounted(ep, m, "prompt-router", splits.test)
    assert (ret.sum(-1) == 1).all()
    f = money_flow(ep, m, splits.test)
    assert f.total_usd == pytest.approx(f.spend.sum(), rel=1e-12)


def test_check_says_what_the_verdicts_cost(fitted) -> None:
    """``check``'s money line names the spend on verdicts inside the spend never returned."""
    from ccpo.evaluation.check import check_policy, report_lines

    ep, pols = fitted
    r = check_policy(pols["single"], ep.subset(np.arange(600, 1000)))
    usd = r.money["verdict_usd_per_question"]
    assert 0 < usd < r.money["unreturned_usd_per_question"]
    assert f"${usd:.6f} of it on verify steps' verdicts" in " ".join(report_lines(r))
    assert any(x.get("verifies") == "tiny-m" for x in r.money["rungs"])


@pytest.fixture(scope="module")
def held_out(traces):
    path, prices = traces
    return routed_on_held_out(path, prices, N_TRAIN, ALPHA, DELTA, None, SPLITS)


@pytest.mark.slow
def test_the_pareto_tested_guarantee_holds_with_verify_steps(held_out) -> None:
    ep, pol, _, _ = held_out
    assert pol.sequence is not None and ep.verify_rounds == (1, 3)
    refused, later, m = held_out_splits(held_out, ALPHA)
    assert refused.mean() <= DELTA
    assert later > 0.1  # routing is in play
    assert over_share(~m.covered, ALPHA) <= DELTA + 0.05
    assert m.covered.mean() >= 1 - ALPHA


@pytest.mark.slow
def test_an_uncalibrated_threshold_breaks_it(held_out) -> None:
    ep, pol, _, test = held_out
    scores = pol.episode_scores(ep)
    m = pol.rollout(ep, scores, np.tile([0.6, 0.0], (len(test), 1)), test)
    assert over_share(~m.covered, ALPHA) > 0.5
