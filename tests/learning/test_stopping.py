"""CStop (replay-trained conformal stopping), depth-k and auto: the pure pieces, the artifact,
and the finite-sample coverage guarantee as a statistical test."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccpo.errors import CCPOError
from ccpo.evaluation.harness import load_episodes, make_splits, split_sizes
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.learning.config import StopConfig
from ccpo.learning.conformal import split_conformal_threshold
from ccpo.learning.replay import calibrated_cost
from ccpo.policies.classifier import stop_features
from ccpo.policies.cstop import StoppingPolicy, fit_stopping, fixable_labels, membership_scores
from ccpo.policies.registry import (
    AUTO_CANDIDATES,
    candidate_fitter,
    fit_auto,
    fit_policy,
    load_policy,
    select_method,
    stopping_fitter,
)
from ccpo.policies.rules import depth_schedule
from ccpo.traces.episodes import conformal_rollout, conformal_sets, covering_scores


def test_fixable_labels_golden():
    correct = np.zeros((4, 3, 2), dtype=bool)
    correct[0, 0, 1] = True  # covered at round 1
    correct[1, 2, 0] = True  # fixable until round 3
    correct[2, 1, 0] = correct[2, 2, 1] = True  # fixable at round 1 only
    solvable = correct.any(axis=(1, 2))  # question 3 is unsolvable
    got = fixable_labels(correct, solvable)
    want = np.array(
        [[0, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]],
        dtype=bool,
    )
    np.testing.assert_array_equal(got, want)


def test_stop_features_use_rounds_up_to_t_only():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(5, 4, 3))
    x = stop_features(obs)
    assert x.shape == (5, 4, 6)
    for t in range(4):
        later = obs.copy()
        later[:, t + 1 :] = rng.normal(size=later[:, t + 1 :].shape)
        np.testing.assert_array_equal(stop_features(later)[:, t], x[:, t])
    np.testing.assert_array_equal(x[:, 0, 3:], 0.0)
    np.testing.assert_array_equal(x[:, 2, 3:], obs[:, 1])


def test_membership_scores_are_the_stop_rule():
    g = np.array([[0.7, 0.2, 0.9, 0.5]])
    e = membership_scores(g)
    np.testing.assert_array_equal(e[..., :2], 1.0)
    np.testing.assert_allclose(e[0, :, 2], [0.7, 0.2, 0.9, 0.0])
    np.testing.assert_allclose(depth_schedule(4), [0.75, 0.5, 0.25, 0.0])


@pytest.fixture(scope="module")
def fitted(sim_episodes):
    return fit_stopping(sim_episodes, np.arange(200), StopConfig(alpha=0.1, seed=0))


def test_family_is_nested_and_covering_scores_are_exact(sim_episodes, fitted):
    """Lower κ runs at least the same rounds and returns a superset; coverage at κ is exactly
    s(q) ≥ κ with s from covering_scores (the conformal score the guarantee rests on)."""
    ep = sim_episodes
    p = fitted.probs(ep.obs)
    s = covering_scores(ep, p)
    prev_reach, prev_inc = None, None
    for kappa in np.linspace(1.0, 0.0, 21):
        reach, inc = conformal_sets(ep, p, kappa)
        m = conformal_rollout(ep, p, kappa)
        np.testing.assert_array_equal(m.covered, s >= kappa)
        np.testing.assert_array_equal(inc[..., 0], reach)  # every answer of a round run
        np.testing.assert_array_equal(inc[..., 1], reach)
        if prev_reach is not None:
            assert (reach >= prev_reach).all() and (inc >= prev_inc).all()
        prev_reach, prev_inc = reach, inc


def test_the_classifier_learns_the_signal(sim_episodes, fitted):
    """On held-out questions the continuation score ranks fixable rounds above the others."""
    from sklearn.metrics import roc_auc_score

    held = np.arange(200, sim_episodes.n)
    g = fitted.continuation(sim_episodes.obs[held])[:, :-1].ravel()
    y = fixable_labels(sim_episodes.correct[held], sim_episodes.solvable[held])[:, :-1].ravel()
    assert roc_auc_score(y, g) > 0.7


@pytest.mark.parametrize("learner", ["hgb", "logistic"])
def test_a_questions_score_does_not_depend_on_its_batch(sim_episodes, learner):
    """κ̂ is one calibration question's score, computed in a batch of all of them; live, a
    question is scored alone (its rounds so far, zero-padded to T, as ``decide`` does). The two
    must agree bit for bit, or a question whose score is exactly κ̂ goes on in replay and stops
    live (``ccpo dry-run`` found one with the logistic learner: 0.20527032811123155 live vs
    κ̂ = ...158, BLAS rounding a row by its place in the batch)."""
    from ccpo.traces.featurize import N_FEATURES

    pol = fit_stopping(sim_episodes, np.arange(200), StopConfig(alpha=0.1, seed=0, learner=learner))
    obs = sim_episodes.obs
    T = obs.shape[1]
    batch = pol.continuation(obs)
    for i in range(0, sim_episodes.n, 3):
        for t in range(1, T):
            alone = np.zeros((T, N_FEATURES), dtype=np.float32)
            alone[:t] = obs[i, :t]
            assert pol.continuation(alone)[t - 1] == batch[i, t - 1], (i, t)
            assert pol.continuation(obs[i : i + 2])[0, t - 1] == batch[i, t - 1], (i, t)


def test_depth_k_picks_the_least_depth_that_covers(sim_episodes):
    ep = sim_episodes
    pol = stopping_fitter("depth-k")(ep, np.arange(10), 0.2, 0)
    p = pol.probs(ep.obs)
    for alpha in (0.05, 0.2, 0.4):
        kappa = float(split_conformal_threshold(covering_scores(ep, p), alpha))
        depth = int(conformal_rollout(ep, p, kappa).length.max())
        assert (conformal_rollout(ep, p, kappa).length == depth).all()
        # κ̂ (the k-th smallest score) covers at least n − k + 1 questions: the chosen depth
        # reaches that, one round less does not
        hit = ep.correct.any(-1)
        cov = [(hit[:, :d].any(-1) | ~ep.solvable).mean() for d in range(1, ep.horizon + 1)]
        k = int(np.floor(alpha * (ep.n + 1)))
        need = (ep.n - k + 1) / ep.n
        assert cov[depth - 1] >= need - 1e-12
        if depth > 1:
            assert cov[depth - 2] < need


def test_agree_k_stops_on_agreement_and_caps_the_depth(sim_episodes):
    ep = sim_episodes
    pol = stopping_fitter("agree-k")(ep, np.arange(10), 0.2, 0)
    g = pol.continuation(ep.obs)
    yes = ep.verdict_yes == 1
    np.testing.assert_array_equal(g[yes], 0.0)
    np.testing.assert_allclose(g[~yes], np.broadcast_to(depth_schedule(4), g.shape)[~yes])
    kappa = float(split_conformal_threshold(covering_scores(ep, pol.probs(ep.obs)), 0.2))
    m = conformal_rollout(ep, pol.probs(ep.obs), kappa)
    first_yes = np.where(yes.any(-1), yes.argmax(-1) + 1, 4)
    if kappa > 0:  # stops at the first agreement (or earlier, at the calibrated cap)
        assert (m.length <= first_yes).all()
    else:  # agreement alone misses the level: every round
        assert (m.length == 4).all()


def test_constant_labels_give_a_constant_score(sim_episodes):
    ep = sim_episodes
    unsolvable = np.flatnonzero(~ep.solvable)[:20]
    pol = fit_stopping(ep, unsolvable, StopConfig())
    assert pol.model == 0.0
    np.testing.assert_array_equal(pol.continuation(ep.obs[:3]), 0.0)


def test_save_load_round_trip_and_version_check(sim_episodes, fitted, tmp_path):
    fitted.kappa_batch = 0.25
    folder = fitted.save(tmp_path / "cstop")
    back = load_policy(folder)
    assert isinstance(back, StoppingPolicy) and back.kappa == 0.25 and back.horizon == 4
    np.testing.assert_array_equal(back.probs(sim_episodes.obs), fitted.probs(sim_episodes.obs))
    meta = json.loads((folder / "policy.json").read_text())
    meta["sklearn_version"] = "0.0.1"
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(CCPOError, match="retrain"):
        load_policy(folder)


def test_auto_picks_the_least_validation_cost_and_records_it(sim_episodes):
    """Every default candidate, CCPO included (30 steps a fold here, to stay fast), is
    cross-fitted on the training questions and the cheapest is kept."""
    ep = sim_episodes
    fitters = {"ccpo": candidate_fitter("ccpo", {"auto_ccpo_steps": 30})}
    sel = select_method(ep, np.arange(200), 0.1, fitters=fitters)
    costs = {k: v["cost_cents_per_question"] for k, v in sel.figures.items()}
    assert set(costs) == set(AUTO_CANDIDATES) >= {"cstop", "cstop-lr", "depth-k", "ccpo"}
    assert sel.method == min(costs, key=costs.get)
    pol, sel2 = fit_auto(ep, np.arange(200), 0.1, fitters=fitters)
    assert sel2 == sel and pol.variant == sel.method
    assert pol.info["auto"]["picked"] == sel.method


def test_auto_without_ccpo_when_its_steps_are_zero(sim_episodes):
    pol = fit_policy("auto", sim_episodes, np.arange(200), 0.1, 0,
                     settings={"auto_ccpo_steps": 0})  # fmt: skip
    figures = pol.info["auto"]["validation"]
    assert "ccpo" not in figures and set(figures) == set(AUTO_CANDIDATES) - {"ccpo"}


def test_calibrated_cost_reaches_the_level(sim_episodes, fitted):
    p = fitted.probs(sim_episodes.obs)
    cost, cov, size = calibrated_cost(sim_episodes, p, 0.1)
    assert 1.0 <= size <= 2 * sim_episodes.horizon  # distinct answers of the rounds run
    assert cov >= 0.9 - 0.02 and cost > 0  # mean over 50 half-splits: E ≥ 1 − α, small noise
    full = sim_episodes.round_cost.sum(-1).mean()
    assert cost < full


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_cstop_coverage_guarantee_statistically(alpha):
    """Finite-sample guarantee (module docstring): E[coverage] ≥ 1 − α over calibration/test
    splits of the held-out pool. 300 random splits (seed 0) of the bundled real
    hotpotqa-public set; the mean must be ≥ 1 − α − 3 standard errors (splits are independent
    draws given the pool, so the SE is sd/√R). It must also cost less than running every
    round, or the guarantee would be trivial."""
    ep, _ = load_episodes(bundled_sets()["hotpotqa-public"])
    sp = make_splits(ep.n, split_sizes(ep.n), 300, seed=0)
    pol = stopping_fitter("cstop")(ep, sp.train, alpha, 0)
    p = pol.probs(ep.obs)
    kappas = split_conformal_threshold(covering_scores(ep, p)[sp.cal], alpha)
    m = conformal_rollout(ep, p, kappas, sp.test)
    cov = m.covered.mean(-1)
    se = cov.std(ddof=1) / np.sqrt(cov.size)
    assert cov.mean() >= 1 - alpha - 3 * se, (cov.mean(), se)
    full = ep.round_cost[sp.test].sum(-1).mean()
    assert m.cost.mean() < 0.9 * full
