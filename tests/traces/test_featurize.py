"""The featurizer sees rounds 1..t only and copes with missing values."""

from __future__ import annotations

import numpy as np

from ccpo.traces.featurize import FEATURE_NAMES, N_FEATURES, featurize_trace


def test_no_peeking_at_later_rounds_or_correctness(sim_traces):
    tr = sim_traces[0]
    base = featurize_trace(tr)
    for t in range(tr.n_rounds):
        changed = tr.model_copy(deep=True)
        for r in changed.rounds[t + 1 :]:
            r.base.answer = "something else entirely"
            r.guide.verdict = "no" if r.guide.verdict == "yes" else "yes"
            r.guide.uncertainty = 4.2
            r.base.usage.output_tokens += 1000
        for r in changed.rounds:
            r.base.correct = not r.base.correct
            r.guide.correct = not r.guide.correct
        changed.gold = ["a different gold"]
        got = featurize_trace(changed)
        np.testing.assert_array_equal(got[: t + 1], base[: t + 1])


def test_missing_values_are_flagged_not_crashed(sim_traces):
    tr = sim_traces[1].model_copy(deep=True)
    for r in tr.rounds:
        r.base.logprob_mean = None
        r.base.logprob_min = None
        r.guide.uncertainty = None
        r.guide.verdict = None
    x = featurize_trace(tr)
    assert x.shape == (tr.n_rounds, N_FEATURES)
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert (x[:, col["base_logprob_missing"]] == 1).all()
    assert (x[:, col["guide_uncertainty_missing"]] == 1).all()
    assert (x[:, col["verdict_missing"]] == 1).all()
    assert np.isfinite(x).all()


def test_round_features(sim_traces):
    tr = sim_traces[2]
    x = featurize_trace(tr)
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    T = tr.n_rounds
    np.testing.assert_allclose(x[:, col["round_frac"]], np.arange(1, T + 1) / T)
    assert x[-1, col["is_last_round"]] == 1 and x[:-1, col["is_last_round"]].sum() == 0
    assert np.all(np.diff(x[:, col["cum_guide_tokens"]]) > 0)
