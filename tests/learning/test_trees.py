"""CStop's compiled trees (ccpo.learning.trees) give scikit-learn's numbers: the same
probabilities and the same continue/stop decision at the calibrated κ̂ on every question of
both bundled sets, alone or in a batch."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.evaluation.harness import load_episodes, make_splits, split_sizes
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.learning.conformal import split_conformal_threshold
from ccpo.learning.trees import compile_hgb
from ccpo.policies.classifier import fixable_probability, stop_features
from ccpo.policies.registry import stopping_fitter
from ccpo.traces.episodes import covering_scores


@pytest.mark.parametrize("name", ["hotpotqa-public", "mmlu-public"])
def test_same_scores_and_decisions_as_sklearn_on_every_bundled_question(name):
    ep, _ = load_episodes(bundled_sets()[name])
    sp = make_splits(ep.n, split_sizes(ep.n), 1, seed=0)
    pol = stopping_fitter("cstop")(ep, sp.train, 0.1, 0)
    trees = compile_hgb(pol.model)
    assert trees is not None and trees.roots.size == pol.config.max_iter
    T = ep.horizon
    rows = stop_features(ep.obs)[:, :-1].reshape(-1, 2 * ep.obs.shape[-1])
    sk = pol.model.predict_proba(rows)[:, 1]
    ours = fixable_probability(pol.model, rows)  # the hook StoppingPolicy uses
    assert np.abs(ours - sk).max() <= 1e-12
    # the decision at the calibrated κ̂ (computed from the compiled scores, as live)
    kappa = float(split_conformal_threshold(covering_scores(ep, pol.probs(ep.obs))[sp.cal[0]], 0.1))
    assert 0.0 < kappa < 1.0
    assert np.array_equal(ours >= kappa, sk >= kappa)
    # each question alone, as the live agent scores it after round t (later rounds zero):
    # bit for bit its batch score
    batch = pol.continuation(ep.obs)
    for i in range(ep.n):
        for t in range(1, T):
            alone = np.zeros_like(ep.obs[i])
            alone[:t] = ep.obs[i, :t]
            assert pol.continuation(alone)[t - 1] == batch[i, t - 1], (i, t)


def _fitted(x: np.ndarray, y: np.ndarray, **kw):
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(max_iter=30, max_leaf_nodes=7, random_state=0, **kw).fit(
        x, y
    )


def test_missing_values_take_the_side_sklearn_learned():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0) | (rng.random(600) < 0.1)
    x[rng.random(x.shape) < 0.2] = np.nan  # NaNs in training: both sides learned
    model = _fitted(x, y)
    trees = compile_hgb(model)
    assert trees is not None and trees.missing_left.any() and not trees.missing_left.all()
    probe = rng.normal(size=(400, 4))
    probe[rng.random(probe.shape) < 0.3] = np.nan
    assert np.abs(trees.predict_proba(probe) - model.predict_proba(probe)[:, 1]).max() <= 1e-12


def test_models_it_cannot_reproduce_stay_with_sklearn():
    rng = np.random.default_rng(1)
    x = np.column_stack([rng.integers(0, 5, 500), rng.normal(size=500)]).astype(float)
    y = (x[:, 0] % 2 == 0) ^ (x[:, 1] > 1)
    cat = _fitted(x, y, categorical_features=[0])
    assert compile_hgb(cat) is None  # categorical splits: bitsets, left to scikit-learn
    assert np.array_equal(fixable_probability(cat, x), cat.predict_proba(x)[:, 1])
    multi = _fitted(x, x[:, 0] % 3)
    assert compile_hgb(multi) is None  # one tree per class
    with pytest.raises(ValueError, match=r"shape \[n, 2\]"):
        compile_hgb(_fitted(x, y)).raw(np.zeros((1, 3)))
