"""Pareto testing: the router threshold τ and the stopping threshold λ certified together.

Setting (as test_routing_guarantee, label-free synthetic 4-model import, 1000 questions, seed
3): a ``cstop-lr`` routed policy fitted on 300 training questions (seed 0) with the Pareto
sequence ``route`` makes there, then walked on 350 calibration questions and scored on the
350 others, over 200 random splits (seed 1). Fixed-sequence testing along an order fixed by
the training split promises P_cal(R(τ̂, λ̂) ≤ α) ≥ 1 − δ, α = 0.2, δ = 0.1. Each split's
test miss rate estimates R(τ̂, λ̂) with standard error ≤ √(α(1 − α)/350) ≈ 0.021; slack: a
split counts as over only past α + 2 SE, and at most δ + 0.05 of the splits may be over. The
cheapest pair of the sequence, taken without the walk, must break it (the test can fail).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ccpo.policies.registry import fit_policy
from ccpo.policies.routing.holder import NO_ROUTE
from ccpo.policies.routing.pareto import pareto_front, pareto_ltt
from ccpo.policies.routing.single import joint_ltt
from ccpo.policies.single import (
    RUN_ALL,
    Unreachable,
    ltt_threshold,
    reachable_alpha,
    reached_labels,
)
from tests.helpers.routing import (
    held_out_splits,
    imported_ladder,
    over_share,
    routed_on_held_out,
)

ALPHA, DELTA, N_TRAIN, SPLITS = 0.2, 0.1, 300, 200


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    traces, prices = imported_ladder(tmp_path_factory.mktemp("pareto"), n=1000, seed=3)
    return routed_on_held_out(traces, prices, N_TRAIN, ALPHA, DELTA, None, SPLITS)


def test_the_joint_guarantee_holds_on_held_out_splits(setting) -> None:
    pol = setting[1]
    assert pol.sequence is not None and tuple(pol.sequence[0]) == (NO_ROUTE, RUN_ALL)
    refused, later, m = held_out_splits(setting, ALPHA)
    assert not refused.any()
    assert later > 0.05  # routing is in play
    assert over_share(~m.covered, ALPHA) <= DELTA + 0.05
    assert m.covered.mean() >= 1 - ALPHA


def test_the_cheapest_pair_without_the_walk_breaks_it(setting) -> None:
    ep, pol, _, test = setting
    scores = pol.episode_scores(ep)
    m = pol.rollout(ep, scores, pol.sequence[-1], test)
    assert over_share(~m.covered, ALPHA) > 0.5


def test_the_order_is_made_from_training_questions_alone(setting) -> None:
    """Other labels on the questions outside the training split (every round but the last,
    at random) change what the walk certifies, never the order it walks."""
    ep, pol, cal, test = setting
    held = np.concatenate([cal[0], test[0]])  # every question outside the training split
    train = np.random.default_rng(0).permutation(ep.n)[:N_TRAIN]  # the helper's, in its order
    assert np.array_equal(np.sort(train), np.setdiff1d(np.arange(ep.n), held))
    other = ep.correct.copy()
    early = other[held, :-1]  # rounds before T: the walk still starts from a certified θ_0
    other[held, :-1] = np.random.default_rng(2).random(early.shape) < 0.5
    relabelled = replace(ep, correct=other)
    again = fit_policy("cstop-lr", relabelled, train, ALPHA, 0, single=True, delta=DELTA,
                       routed=True)  # fmt: skip
    assert np.array_equal(again.sequence, pol.sequence)
    c = cal[0]
    a = pareto_ltt(ep.subset(c), pol.episode_scores(ep).take(c), ALPHA, DELTA, pol.sequence)
    b = pareto_ltt(relabelled.subset(c), again.episode_scores(relabelled).take(c), ALPHA, DELTA,
                   again.sequence)  # fmt: skip
    assert (a[1].misses, a[1].tested) != (b[1].misses, b[1].tested)


def test_a_refusal_names_the_reachable_alpha_as_before(setting) -> None:
    ep, pol, cal, _ = setting
    c = cal[0]
    sub, sc = ep.subset(c), pol.episode_scores(ep).take(c)
    with pytest.raises(Unreachable) as got:
        pareto_ltt(sub, sc, 0.001, DELTA, pol.sequence)
    k0 = int((~reached_labels(sub)[:, -1]).sum())  # misses of round T's answer
    assert f"certifies α ≥ {reachable_alpha(k0, sub.n, DELTA):.3f}" in str(got.value)
    with pytest.raises(Unreachable) as before:
        joint_ltt(sub, sc, 0.001, DELTA, (NO_ROUTE,))
    assert str(got.value) == str(before.value)


def test_the_front_keeps_undominated_pairs_from_safest_to_cheapest() -> None:
    risk = np.array([0.00, 0.05, 0.05, 0.10, 0.02, 0.30, 0.10])
    cost = np.array([9.00, 5.00, 6.00, 5.00, 7.00, 1.00, 2.00])
    rounds = np.array([4, 2, 1, 1, 3, 1, 2])
    assert pareto_front(risk, cost, rounds).tolist() == [0, 4, 1, 6, 5]
    same = np.array([0.1, 0.1]), np.array([1.0, 1.0])
    assert pareto_front(*same, np.array([3, 2])).tolist() == [1]  # fewer rounds at a tie


def test_check_restores_lambda_at_the_policys_own_tau(setting) -> None:
    """``check`` proposes λ certified at the policy's τ̂ (the one threshold a deploy config
    sets), not a pair of the sequence at another τ."""
    from ccpo.evaluation.check import check_policy

    ep, pol, cal, test = setting
    pol = replace(pol, inner=replace(pol.inner))
    pol.calibrate(ep, cal[0])
    sub = ep.subset(test[0])
    report = check_policy(pol, sub)
    at_own = ltt_threshold(sub, pol.episode_scores(sub).at(pol.tau)[1], ALPHA, DELTA)
    assert report.kappa_to_restore == at_own.threshold
