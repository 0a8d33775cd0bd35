"""Baselines on synthetic traces (SYNTHETIC data, ccpo.traces.sim)."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.errors import CCPOError
from ccpo.evaluation.harness import make_splits
from ccpo.learning.baselines import (
    LLMPolicy,
    OraclePolicy,
    RandomPolicy,
    UALAPolicy,
    make_baseline,
    oracle_metrics,
    uala_actions,
)
from ccpo.learning.conformal import split_conformal_threshold
from ccpo.traces.episodes import BASE, GUIDE, NEXT, conformal_rollout, covering_scores
from tests.helpers.probs import random_probs


@pytest.fixture(scope="module")
def splits(sim_episodes):
    return make_splits(sim_episodes.n, (100, 100, 100), 40, seed=3)


def test_splits_are_disjoint_and_train_is_fixed(sim_episodes, splits):
    for cal, test in zip(splits.cal, splits.test, strict=True):
        assert not set(cal) & set(test)
        assert not (set(cal) | set(test)) & set(splits.train)
    again = make_splits(sim_episodes.n, (100, 100, 100), 40, seed=3)
    np.testing.assert_array_equal(again.test, splits.test)


def test_random_policy_is_uniform(sim_episodes, splits):
    m = RandomPolicy().evaluate(sim_episodes, splits, 0.1, seed=0)
    # P(stop at round 1) = 2/3 for a uniform choice among base/guide/next
    assert abs((m.length == 1).mean() - 2 / 3) < 0.03
    assert (m.set_size == 1).all()


def test_fixed_policies_answer_at_round_one(sim_episodes, splits):
    ep = sim_episodes
    for name, a in (("base", 0), ("guide", 1)):
        m = make_baseline(name).evaluate(ep, splits, 0.1, 0)
        assert (m.length == 1).all()
        expect = ep.correct[splits.test, 0, a] | ~ep.solvable[splits.test]
        np.testing.assert_array_equal(m.covered, expect)
        np.testing.assert_allclose(m.cost, ep.round_cost[splits.test, 0])


def test_uala_rule():
    yes = np.array([[1.0, 0.0, np.nan, 1.0]])
    u = np.array([[0.1, 0.2, 0.9, np.nan]])
    acts = uala_actions(yes, u, np.array([0.15]), np.array([0.5]))
    np.testing.assert_array_equal(acts[0, 0], [BASE, GUIDE, NEXT, BASE])


def test_uala_meets_coverage_on_calibration(sim_episodes, splits):
    ep = sim_episodes
    pol = UALAPolicy()
    pol.evaluate(ep, splits, 0.2, 0)
    tb, tg = pol.thresholds[0]
    acts = uala_actions(ep.verdict_yes[splits.cal[0]], ep.uncertainty[splits.cal[0]], [tb], [tg])
    from ccpo.traces.episodes import point_rollout

    m = point_rollout(ep, acts[0], splits.cal[0])
    assert m.covered.mean() >= 0.8


def test_oracle_is_a_floor_for_every_covering_policy(sim_episodes, splits):
    """No conformal policy reaching 1−α on a split pays less than the oracle on that split."""
    ep, alpha = sim_episodes, 0.1
    orc = OraclePolicy().evaluate(ep, splits, alpha, 0)
    assert (orc.covered.mean(1) >= 1 - alpha).all()
    rng = np.random.default_rng(5)
    for _ in range(5):
        probs = random_probs(rng, ep.n, ep.horizon)
        for kappa in (0.0, 0.1, 0.3):
            m = conformal_rollout(ep, probs, kappa, splits.test)
            ok = m.covered.mean(1) >= 1 - alpha
            assert (m.cost.sum(1)[ok] >= orc.cost.sum(1)[ok] - 1e-12).all()


def test_oracle_uses_its_allowance(sim_episodes, splits):
    ep = sim_episodes
    strict = oracle_metrics(ep, splits.test, 1e-9)
    loose = oracle_metrics(ep, splits.test, 0.2)
    assert strict.covered.all()
    assert (loose.cost.sum(1) <= strict.cost.sum(1)).all()
    assert (loose.covered.mean(1) >= 0.8).all()


def test_llm_policy_adds_its_own_cost(sim_episodes, splits):
    ep = sim_episodes
    pol = LLMPolicy("sim-guide")
    m = pol.evaluate(ep, splits, 0.1, 0)
    acts = ep.llm_actions["sim-guide"][splits.test]
    stop = np.argmax(acts != NEXT, axis=-1)
    ran = np.arange(ep.horizon) <= stop[..., None]
    expect = ((ep.round_cost + ep.llm_cost["sim-guide"])[splits.test] * ran).sum(-1)
    np.testing.assert_allclose(m.cost, expect)
    with pytest.raises(CCPOError, match="no LLM-as-policy"):
        LLMPolicy("gpt-4o").evaluate(ep, splits, 0.1, 0)


def test_batch_conformal_beats_target_on_average(sim_episodes, splits):
    """Split conformal on the harness's own splits: mean coverage ≥ 1−α − slack (seed 9)."""
    ep, alpha = sim_episodes, 0.2
    probs = random_probs(np.random.default_rng(9), ep.n, ep.horizon)
    s = covering_scores(ep, probs)
    kappa = split_conformal_threshold(s[splits.cal], alpha)
    m = conformal_rollout(ep, probs, kappa, splits.test)
    se = np.sqrt(alpha * (1 - alpha) / 100) / np.sqrt(splits.n_splits)
    assert m.covered.mean() >= 1 - alpha - 4 * se


def test_unknown_policy_name():
    with pytest.raises(CCPOError, match="unknown policy"):
        make_baseline("telepathy")
