"""The episode engine against a literal, loop-by-loop reading of docs/design.md's "Episode
semantics"."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.traces.episodes import (
    BASE,
    GUIDE,
    NEXT,
    conformal_rollout,
    covering_scores,
    point_rollout,
)
from tests.helpers.probs import random_probs


def literal_conformal(ep, probs, kappa, i):
    """One question, walked round by round exactly as docs/design.md says."""
    T = ep.horizon
    answers, cost, rounds = set(), 0.0, 0
    covered = False
    for t in range(T):
        rounds += 1
        cost += ep.round_cost[i, t]
        allowed = [BASE, GUIDE] + ([NEXT] if t < T - 1 else [])
        C = {a for a in allowed if probs[i, t, a] >= kappa}
        if not C:
            C = {max(allowed, key=lambda a: probs[i, t, a])}
        for a in (BASE, GUIDE):
            if a in C:
                answers.add(int(ep.answer_id[i, t, a]))
                covered |= bool(ep.correct[i, t, a])
        if NEXT not in C:
            break
    covered |= not ep.solvable[i]
    return cost, covered, rounds, len(answers)


def literal_point(ep, actions, i):
    for t in range(ep.horizon):
        a = actions[i, t]
        if a != NEXT:
            cost = ep.round_cost[i, : t + 1].sum()
            return cost, bool(ep.correct[i, t, a]) or not ep.solvable[i], t + 1, 1
    raise AssertionError("no answer")


@pytest.mark.parametrize("kappa", [0.0, 0.05, 0.2, 0.33, 0.5, 0.8, 1.0])
def test_conformal_rollout_matches_literal_semantics(sim_episodes, kappa):
    ep = sim_episodes
    probs = random_probs(np.random.default_rng(1), ep.n, ep.horizon)
    m = conformal_rollout(ep, probs, kappa)
    for i in range(ep.n):
        cost, cov, length, size = literal_conformal(ep, probs, kappa, i)
        assert m.cost[i] == pytest.approx(cost)
        assert m.covered[i] == cov
        assert m.length[i] == length
        assert m.set_size[i] == size


def test_covering_score_is_exact_threshold(sim_episodes):
    """Covered at κ iff s(q) ≥ κ, checked on every distinct π value (the only change points)."""
    ep = sim_episodes
    probs = random_probs(np.random.default_rng(2), ep.n, ep.horizon)
    s = covering_scores(ep, probs)
    grid = np.unique(np.concatenate([probs.ravel(), [0.0, 1.0]]))
    grid = np.concatenate([grid, np.nextafter(grid, 2.0)])[::7]
    for k in grid:
        m = conformal_rollout(ep, probs, float(k))
        np.testing.assert_array_equal(m.covered, s >= k)


def test_conformal_split_batch_matches_per_split(sim_episodes):
    ep = sim_episodes
    rng = np.random.default_rng(3)
    probs = random_probs(rng, ep.n, ep.horizon)
    idx = np.stack([rng.permutation(ep.n)[:50] for _ in range(6)])
    kappas = rng.uniform(0, 0.7, size=6)
    m = conformal_rollout(ep, probs, kappas, idx)
    assert m.cost.shape == (6, 50)
    for k in range(6):
        single = conformal_rollout(ep, probs, float(kappas[k]))
        np.testing.assert_allclose(m.cost[k], single.cost[idx[k]])
        np.testing.assert_array_equal(m.covered[k], single.covered[idx[k]])
        np.testing.assert_array_equal(m.set_size[k], single.set_size[idx[k]])
        np.testing.assert_array_equal(m.length[k], single.length[idx[k]])


def test_kappa_zero_runs_every_round_and_covers_everything(sim_episodes):
    ep = sim_episodes
    probs = random_probs(np.random.default_rng(4), ep.n, ep.horizon)
    m = conformal_rollout(ep, probs, 0.0)
    assert (m.length == ep.horizon).all()
    assert m.covered.all()
    np.testing.assert_allclose(m.cost, ep.round_cost.sum(1))


def test_empty_set_falls_back_to_argmax(sim_episodes):
    """κ above every π: each round's set is {argmax}, so exactly one answer or one 'next'."""
    ep = sim_episodes
    probs = random_probs(np.random.default_rng(5), ep.n, ep.horizon)
    m = conformal_rollout(ep, probs, 1.0)
    actions = np.argmax(np.where(ep.allowed, probs, -1), axis=-1)
    ref = point_rollout(ep, actions)
    np.testing.assert_array_equal(m.length, ref.length)
    np.testing.assert_array_equal(m.covered, ref.covered)
    assert (m.set_size == 1).all()


def test_masked_next_never_enters_the_set(sim_episodes):
    """Even at κ = 0 (every allowed action in C) the rollout stops after round T."""
    ep = sim_episodes
    probs = random_probs(np.random.default_rng(6), ep.n, ep.horizon)
    probs[:, -1] = [0.0, 0.0, 1.0]  # a buggy π putting mass on masked 'next'
    m = conformal_rollout(ep, probs, 0.5)
    assert m.length.max() <= ep.horizon


def test_point_rollout_matches_literal(sim_episodes):
    ep = sim_episodes
    rng = np.random.default_rng(7)
    actions = rng.integers(0, 3, size=(ep.n, ep.horizon))
    actions[:, -1] = rng.integers(0, 2, size=ep.n)
    m = point_rollout(ep, actions)
    for i in range(ep.n):
        cost, cov, length, _size = literal_point(ep, actions, i)
        assert m.cost[i] == pytest.approx(cost)
        assert m.covered[i] == cov
        assert m.length[i] == length


def test_point_rollout_rejects_next_at_last_round(sim_episodes):
    ep = sim_episodes
    actions = np.full((ep.n, ep.horizon), NEXT)
    with pytest.raises(ValueError, match="last round"):
        point_rollout(ep, actions)


def test_unsolvable_counts_as_covered(sim_episodes):
    ep = sim_episodes
    unsolvable = ~ep.solvable
    assert unsolvable.any(), "the fixture should hold some unsolvable questions"
    actions = np.zeros((ep.n, ep.horizon), dtype=int)  # always the base answer at round 1
    m = point_rollout(ep, actions)
    assert m.covered[unsolvable].all()
    np.testing.assert_array_equal(m.covered[~unsolvable], ep.correct[~unsolvable, 0, 0])
