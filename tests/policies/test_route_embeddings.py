"""The routed single-answer guarantee when the router reads question embeddings and some may
be missing at serve time, on held-out splits.

A router reading the 4-model import's question embeddings (the first number carries the
question's difficulty, which its text does not) and its text-only fallback are fitted on 300
training questions (seed 0), τ fixed before calibration. Learn-then-Test calibrates λ̂ on 350
questions with each question's loss the worse of with and without its embedding, and the
other 350 are scored over 200 random splits (seed 1) three ways: every embedding there, none
(every question falls back), and the worst of the two per question (an adversary choosing
which embeddings fail). Learn-then-Test promises P_cal(R(λ̂) ≤ α) ≥ 1 − δ, α = 0.2, δ = 0.1,
under any of them. Slack as in test_routing_guarantee: a split is over past α + 2 SE
(SE = √(α(1 − α)/350) ≈ 0.021), and at most δ + 0.05 of the splits may be over.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.policies.routing.single import routed_outcomes
from ccpo.traces.io import read_traces, write_traces
from ccpo.traces.schema import QuestionEmbedding
from tests.helpers.routing import (
    EMBED_MODEL,
    difficulty_embedder,
    imported_ladder,
    over_share,
    routed_on_held_out,
)

ALPHA, DELTA, N_TRAIN, SPLITS, TAU = 0.2, 0.1, 300, 200, 0.6


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embedded")
    traces, prices = imported_ladder(folder, n=1000, seed=3)
    embed = difficulty_embedder(traces)
    rows = []
    for tr in read_traces(traces):
        emb = QuestionEmbedding(model=EMBED_MODEL, vector=embed(tr.question))
        rows.append(tr.model_copy(update={"question_embedding": emb}))
    write_traces(folder / "embedded.jsonl", rows)
    return routed_on_held_out(
        folder / "embedded.jsonl", prices, N_TRAIN, ALPHA, DELTA, TAU, SPLITS, embeddings=True
    )


def test_the_guarantee_holds_with_or_without_each_embedding(setting) -> None:
    ep, pol, cal, test = setting
    assert pol.route_embedding_model == EMBED_MODEL and pol.fallback is not None
    scores = pol.episode_scores(ep)
    th, refused = pol.split_thresholds(ep, scores, cal, ALPHA)
    assert not refused.any()
    tau, lam = th[:, :1], th[:, 1:]
    s_emb, _, with_emb = routed_outcomes(ep, scores, tau, lam, test)
    s_txt, _, without = routed_outcomes(ep, scores, tau, lam, test, fallback=True)
    assert (s_emb > 0).mean() > 0.3  # the embeddings route
    assert (s_emb != s_txt).mean() > 0.1  # and the fallback routes otherwise
    worst = with_emb.covered & without.covered  # an adversary picks which embeddings fail
    for covered in (with_emb.covered, without.covered, worst):
        assert over_share(~covered, ALPHA) <= DELTA + 0.05
        assert covered.mean() >= 1 - ALPHA


def test_an_uncalibrated_threshold_breaks_it(setting) -> None:
    ep, pol, _, test = setting
    scores = pol.episode_scores(ep)
    first = np.tile([0.25, 0.0], (len(test), 1))  # a loose τ, then stop at once
    for fallback in (False, True):
        m = routed_outcomes(ep, scores, first[:, :1], first[:, 1:], test, fallback)[2]
        assert over_share(~m.covered, ALPHA) > 0.5
