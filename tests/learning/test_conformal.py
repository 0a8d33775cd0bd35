"""Conformal maths: exact order statistics, the corrected online sign, and statistical tests.

Statistical tests state their seeds and slack. With R splits of n_test questions, the mean test
coverage has standard error ≈ sqrt(α(1−α)/n_test)/sqrt(R) (plus calibration noise, which also
averages over splits); we allow 4 standard errors of slack below 1−α.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ccpo.learning.conformal import (
    OnlineThreshold,
    binomial_cdf,
    coverage_interval,
    decaying_step_size,
    online_threshold_update,
    short_beyond_noise,
    split_conformal_threshold,
)
from ccpo.traces.episodes import conformal_rollout, covering_scores
from tests.helpers.probs import random_probs


def test_split_threshold_is_the_kth_smallest():
    s = np.array([0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6])  # n = 9
    # alpha = 0.2 -> k = floor(0.2 * 10) = 2 -> second smallest = 0.2
    assert split_conformal_threshold(s, 0.2) == pytest.approx(0.2)
    # alpha = 0.05 -> k = 0 -> kappa = 0 (everything in the set)
    assert split_conformal_threshold(s, 0.05) == 0.0


def test_split_threshold_clips_infinite_scores_and_vectorises():
    s = np.array([[np.inf, np.inf, np.inf, 0.3], [0.1, 0.2, 0.3, 0.4]])
    k = split_conformal_threshold(s, 0.4)  # k = floor(0.4 * 5) = 2
    np.testing.assert_allclose(k, [1.0, 0.2])


def test_alpha_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="alpha"):
        split_conformal_threshold(np.ones(5), 1.5)
    with pytest.raises(ValueError, match="alpha"):
        online_threshold_update(0.5, 1.0, 0.0, 0.1)


def test_online_update_sign_grows_sets_after_a_miss():
    # A miss must lower kappa (bigger sets {pi >= kappa}); a hit raises it a little.
    assert online_threshold_update(0.5, covered=0.0, alpha=0.1, eta=0.1) == pytest.approx(0.41)
    assert online_threshold_update(0.5, covered=1.0, alpha=0.1, eta=0.1) == pytest.approx(0.51)
    assert online_threshold_update(0.01, covered=0.0, alpha=0.1, eta=1.0) == 0.0


def test_decaying_step():
    np.testing.assert_allclose(decaying_step_size([1, 4], 0.5, 0.1), [0.5, 0.5 * 4**-0.6])
    with pytest.raises(ValueError):
        decaying_step_size(0, 0.5)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_split_conformal_coverage_over_random_splits(alpha):
    """Seed 11; 400 splits of 200 calibration / 200 test i.i.d. scores with ties."""
    rng = np.random.default_rng(11)
    R, n_cal, n_test = 400, 200, 200
    scores = np.round(rng.beta(2, 3, size=(R, n_cal + n_test)), 2)  # ties on purpose
    kappa = split_conformal_threshold(scores[:, :n_cal], alpha)
    cov = (scores[:, n_cal:] >= kappa[:, None]).mean(1)
    se = np.sqrt(alpha * (1 - alpha) / n_test) / np.sqrt(R)
    assert cov.mean() >= 1 - alpha - 4 * se
    # not wildly above: the upper bound 1 - alpha + 1/(n+1) plus tie slack (scores on a 0.01 grid)
    assert cov.mean() <= 1 - alpha + 1 / (n_cal + 1) + 0.02


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_split_conformal_coverage_with_episode_engine(sim_episodes, alpha):
    """End to end on synthetic traces: seed 12, 300 random calibration/test splits (150/150)."""
    ep = sim_episodes
    rng = np.random.default_rng(12)
    probs = random_probs(rng, ep.n, ep.horizon)
    s = covering_scores(ep, probs)
    R, n_cal = 300, 150
    perms = np.stack([rng.permutation(ep.n) for _ in range(R)])
    cal, test = perms[:, :n_cal], perms[:, n_cal:]
    kappa = split_conformal_threshold(s[cal], alpha)
    m = conformal_rollout(ep, probs, kappa, test)
    cov = m.covered.mean(1)
    n_test = test.shape[1]
    se = np.sqrt(alpha * (1 - alpha) / n_test) / np.sqrt(R)
    assert cov.mean() >= 1 - alpha - 4 * se
    assert cov.mean() <= 1 - alpha + 0.06


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_online_tracker_long_run_coverage_iid(alpha):
    """Seed 13; i.i.d. scores U(0,1): covered iff s >= kappa. 20,000 steps with decaying η.

    The long-run coverage converges to 1 − α (Angelopoulos et al. 2024): checked on the second
    half of the stream to ±0.015, and κ ends near the α-quantile (= α) to ±0.03.
    """
    rng = np.random.default_rng(13)
    tr = OnlineThreshold(alpha=alpha, kappa=0.9, eta0=1.0)
    hits = []
    for s in rng.uniform(size=20_000):
        covered = float(s >= tr.kappa)
        hits.append(covered)
        tr.update(covered)
    assert abs(np.mean(hits[10_000:]) - (1 - alpha)) < 0.015
    assert abs(tr.kappa - alpha) < 0.03


def test_paper_sign_diverges_where_corrected_sign_converges():
    """The paper's printed update κ ← κ + η(1 − covered − α) runs away; ours does not."""
    rng = np.random.default_rng(14)
    k_paper, k_ours = 0.5, 0.5
    for step, s in enumerate(rng.uniform(size=5_000), start=1):
        eta = float(decaying_step_size(step, 0.5))
        k_paper = float(np.clip(k_paper + eta * (1 - float(s >= k_paper) - 0.1), 0, 1))
        k_ours = online_threshold_update(k_ours, float(s >= k_ours), 0.1, eta)
    assert k_paper in (0.0, 1.0)
    assert abs(k_ours - 0.1) < 0.05


@pytest.mark.parametrize("alpha", [0.5, 1 / 3, 0.3, 0.2, 0.1, 0.07, 0.05, 0.01, 0.001])
def test_min_calibration_size_is_the_least_n_with_a_nontrivial_threshold(alpha):
    """n = min_calibration_size(α) calibration scores (all 0.5) give κ̂ = 0.5 > 0, n − 1 give
    κ̂ = 0: the same floor ⌊α(n+1)⌋ as the threshold itself, n = ⌈1/α⌉ − 1."""
    from ccpo.learning.conformal import min_calibration_size

    n = min_calibration_size(alpha)
    assert split_conformal_threshold(np.full(n, 0.5), alpha) == 0.5
    assert n == 1 or split_conformal_threshold(np.full(n - 1, 0.5), alpha) == 0.0
    assert n == math.ceil(1 / alpha) - 1


def test_short_beyond_noise_is_the_clopper_pearson_test_without_a_quantile():
    """The binomial sum gives the same verdict as the Clopper-Pearson interval (scipy's beta
    quantile) for every count of every window up to 40 and of 100, 199 and 200 (the server's
    window) at three α: 4,086 cases, no tie."""
    for alpha in (0.05, 0.1, 0.3):
        for n in [*range(1, 41), 100, 199, 200]:
            for k in range(n + 1):
                upper = coverage_interval(k, n)[1]
                assert short_beyond_noise(k, n, alpha) == (upper < 1 - alpha), (alpha, n, k)
    assert binomial_cdf(3, 10, 0.5) == pytest.approx(176 / 1024, rel=1e-12)
    assert binomial_cdf(10, 10, 0.3) == 1.0 and binomial_cdf(0, 10, 1.0) == 0.0
