"""The marginal single-answer guarantee (conformal risk control along the fixed sequence,
``ccpo.policies.risk_control``): its pure rule, and its coverage on held-out splits.

Held-out setting (as test_routing_guarantee: the label-free synthetic 4-model import, 1000
questions, seed 3): a routed ``cstop-lr`` policy fitted on 300 training questions (seed 0),
(τ, λ) walked along its Pareto sequence on 350 calibration questions and scored on the 350
others, over 200 random splits (seed 1). The promise is marginal: the miss rate averaged over
calibration draws and new questions is at most α. The mean over 200 splits estimates that
with a standard error of about √(α(1 − α)/350)/√200 ≈ 0.0015 (more with the splits'
overlap); slack 0.01. Learn-then-Test on the same splits must cost more (its test has slack
the marginal rule does not), so the comparison can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.policies.risk_control import last_passing, marginal_bound, passes
from ccpo.policies.single import allowed_misses
from tests.helpers.routing import held_out_splits, imported_ladder, routed_on_held_out

ALPHA, DELTA, N_TRAIN, SPLITS = 0.2, 0.1, 300, 200


def test_the_bound_counts_a_miss_at_every_later_threshold() -> None:
    # question 0 misses at θ_1 only; question 1 at θ_2: monotonised, θ_2 counts both
    losses = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=bool)
    np.testing.assert_allclose(marginal_bound(losses), [1 / 4, 2 / 4, 3 / 4])
    assert passes(losses, 0.5, None).tolist() == [True, True, False]
    assert last_passing(losses, 0.5, None) == 1
    assert last_passing(losses, 0.2, None) == -1  # θ_0 fails: (0 + 1)/(3 + 1) > 0.2


def test_marginal_allows_more_misses_than_the_binomial_test() -> None:
    n = 56
    k = np.arange(n + 1)
    losses = np.zeros((n + 1, n), dtype=bool)  # row j: j misses (a prefix, so monotone)
    for j in k:
        losses[j, :j] = True
    marginal = last_passing(losses, ALPHA, None)
    pac = last_passing(losses, ALPHA, DELTA)
    assert marginal == 10 and (10 + 1) / (n + 1) <= ALPHA < (11 + 1) / (n + 1)
    assert pac == allowed_misses(n, ALPHA, DELTA) == 6


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    return imported_ladder(tmp_path_factory.mktemp("marginal"), n=1000, seed=3)


def test_the_marginal_guarantee_holds_on_held_out_splits(ladder) -> None:
    traces, prices = ladder
    marginal = routed_on_held_out(traces, prices, N_TRAIN, ALPHA, DELTA, None, SPLITS,
                                  settings={"guarantee": "marginal"})  # fmt: skip
    refused, later, m = held_out_splits(marginal, ALPHA)
    assert not refused.any() and later > 0.05  # routing is in play (8.5% start later)
    miss = (~m.covered).mean()
    assert miss <= ALPHA + 0.01, miss
    pac = routed_on_held_out(traces, prices, N_TRAIN, ALPHA, DELTA, None, SPLITS)
    _, _, m_pac = held_out_splits(pac, ALPHA)
    # the binomial test's slack is paid in calls: Learn-then-Test misses less and costs more
    assert (~m_pac.covered).mean() < miss and m_pac.cost.mean() > m.cost.mean()
