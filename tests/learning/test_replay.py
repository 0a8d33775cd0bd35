"""Exact soft-rollout expectations (CCPO ``rollouts="exact"``): gradients and the hard limit."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.learning.heads import log_pi
from ccpo.learning.replay import point_rollout_expectations, soft_set_rollout
from ccpo.traces.episodes import allowed_actions, conformal_rollout, point_rollout


def _problem(seed: int, B: int = 6, T: int = 4):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=1.5, size=(B, T, 3))
    correct = rng.random((B, T, 2)) < 0.3
    cost = rng.uniform(0.5, 2.0, size=(B, T))
    return logits, allowed_actions(T), correct, correct.any(axis=(1, 2)), cost


def _numeric_grad(f, logits, allowed, h=1e-6):
    """Central differences of the scalar f at ``logits`` (0 on masked actions)."""
    num = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape):
        if not allowed[idx[1], idx[2]]:
            continue
        zp, zm = logits.copy(), logits.copy()
        zp[idx] += h
        zm[idx] -= h
        num[idx] = (f(zp) - f(zm)) / (2 * h)
    return num


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradients_match_finite_differences(seed):
    logits, allowed, correct, solvable, cost = _problem(seed)
    w = (0.7, -0.3, 2.0)
    kappa, eps = 0.3, 0.2

    def f(z):
        o, _ = soft_set_rollout(z, allowed, correct, solvable, cost, kappa, eps)
        return w[0] * o.cost.sum() + w[1] * o.size.sum() + w[2] * o.coverage.sum()

    _, grad = soft_set_rollout(logits, allowed, correct, solvable, cost, kappa, eps, w)
    np.testing.assert_allclose(grad, _numeric_grad(f, logits, allowed), rtol=1e-4, atol=1e-7)


def test_small_eps_is_the_hard_rollout(sim_episodes):
    """As ε → 0 the expectations are the hard rollout's cost, set size and coverage."""
    ep = sim_episodes
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=2.0, size=(ep.n, ep.horizon, 3))
    kappa = 0.3
    out, _ = soft_set_rollout(
        logits, ep.allowed, ep.correct, ep.solvable, ep.round_cost, kappa, 1e-9
    )
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p[:, -1, 2] = 0
    p /= p.sum(-1, keepdims=True)
    hard = conformal_rollout(ep, p, kappa)
    np.testing.assert_allclose(out.cost, hard.cost, rtol=1e-9)
    np.testing.assert_array_equal(out.coverage > 0.5, hard.covered)
    assert (out.size >= hard.set_size - 1e-9).all()  # repeats counted: never fewer


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_point_gradients_match_finite_differences(seed):
    logits, allowed, correct, solvable, cost = _problem(seed)
    w = (0.7, 2.0)

    def f(z):
        o, _ = point_rollout_expectations(z, allowed, correct, solvable, cost)
        return w[0] * o.cost.sum() + w[1] * o.coverage.sum()

    _, grad = point_rollout_expectations(logits, allowed, correct, solvable, cost, w)
    np.testing.assert_allclose(grad, _numeric_grad(f, logits, allowed), rtol=1e-4, atol=1e-7)


def test_point_expectations_are_the_mean_of_sampled_point_rollouts(sim_episodes):
    """The closed form equals the Monte Carlo mean of the point rollout (seed 0, 4,000 draws
    per question; slack 5 standard errors)."""
    ep = sim_episodes.subset(np.arange(20))
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=1.0, size=(ep.n, ep.horizon, 3))
    out, _ = point_rollout_expectations(logits, ep.allowed, ep.correct, ep.solvable, ep.round_cost)
    p = np.exp(log_pi(logits, ep.allowed))
    draws = 4000
    u = rng.random((draws, ep.n, ep.horizon, 1))
    actions = np.minimum((p.cumsum(-1)[None] < u).sum(-1), 2)
    actions[..., -1] = np.minimum(actions[..., -1], 1)
    m = point_rollout(ep, actions, np.broadcast_to(np.arange(ep.n), (draws, ep.n)))
    for got, sample in ((out.cost, m.cost), (out.coverage, m.covered.astype(float))):
        se = sample.std(0) / np.sqrt(draws) + 1e-12
        assert (np.abs(sample.mean(0) - got) <= 5 * se + 1e-12).all()
