"""The single-answer guarantee with routing in play, on held-out splits.

A routed policy (router and stopping classifier fitted on 300 training questions of the
label-free 4-model import, seed 0; τ fixed before calibration so that a third of the
questions or more skip a rung) is calibrated by Learn-then-Test on 350 questions and scored
on the 350 others, over 200 random splits (seed 1). Learn-then-Test promises
P_cal(R(λ̂) ≤ α) ≥ 1 − δ with α = 0.2, δ = 0.1. Each split's test miss rate estimates R(λ̂)
with standard error ≤ √(α(1 − α)/350) ≈ 0.021; slack: a split counts as over only past
α + 2 SE, and at most δ + 0.05 of the splits may be over. The same splits at a λ that
ignores calibration (stop at the first round run) must break it, so the test can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.routing import (
    held_out_splits,
    imported_ladder,
    over_share,
    routed_on_held_out,
)

ALPHA, DELTA, N_TRAIN, SPLITS = 0.2, 0.1, 300, 200


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    traces, prices = imported_ladder(tmp_path_factory.mktemp("guarantee"), n=1000, seed=3)
    # τ fixed before calibration
    return routed_on_held_out(traces, prices, N_TRAIN, ALPHA, DELTA, 0.6, SPLITS)


def test_the_guarantee_holds_with_routing_in_play(setting) -> None:
    refused, later, m = held_out_splits(setting, ALPHA)
    assert not refused.any()
    assert later > 0.3  # routing is in play
    assert over_share(~m.covered, ALPHA) <= DELTA + 0.05
    assert m.covered.mean() >= 1 - ALPHA


def test_an_uncalibrated_threshold_breaks_it(setting) -> None:
    ep, pol, _, test = setting
    scores = pol.episode_scores(ep)
    m = pol.rollout(ep, scores, np.tile([0.6, 0.0], (len(test), 1)), test)
    assert over_share(~m.covered, ALPHA) > 0.5
