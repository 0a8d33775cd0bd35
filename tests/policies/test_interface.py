"""Every technique behind the one Policy interface: fitted by name through the registry, it
calibrates, replays and decides through the same methods, and its two replays agree."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.learning.config import TrainConfig
from ccpo.policies import Policy
from ccpo.policies.registry import METHODS, SINGLE_METHODS, fit_policy
from ccpo.runtime.decision import decide
from ccpo.traces.episodes import build_episodes
from ccpo.traces.prices import load_prices
from ccpo.traces.sim import SimConfig, generate

FAST = TrainConfig(steps=3, exact_batch_size=8, val_every=0, keep_best=False)
CASES = [(m, False) for m in METHODS if m != "auto"] + [(m, True) for m in SINGLE_METHODS]


@pytest.fixture(scope="module")
def world():
    traces = generate(SimConfig(n=240, seed=5))
    return traces, build_episodes(traces, load_prices())


@pytest.mark.parametrize(("method", "single"), CASES)
def test_a_technique_fits_calibrates_and_replays_through_the_interface(world, method, single):
    _, ep = world
    pol = fit_policy(method, ep, np.arange(120), 0.2, seed=1, single=single, train_config=FAST)
    assert isinstance(pol, Policy)
    assert pol.single == single and pol.alpha == 0.2
    if pol.calibrates:
        assert not pol.is_calibrated
        got = pol.calibrate(ep, np.arange(120, 200))
        assert pol.threshold == got.threshold and got.n == 80
    assert pol.is_calibrated
    test = ep.subset(np.arange(200, 240))
    scores = pol.scores(test.obs)
    m = pol.rollout(test, scores, pol.threshold)
    if not pol.greedy:  # the answer-set replay and the metrics replay are one rule
        reach, included = pol.replay_answers(test)
        assert np.array_equal(reach.sum(-1), m.length)
        np.testing.assert_allclose((test.round_cost * reach).sum(-1), m.cost)
        covered = (included & test.correct).any((-1, -2)) | ~test.solvable
        assert np.array_equal(covered, m.covered)
    cal = np.stack([np.arange(120, 160), np.arange(160, 200)])
    thresholds, refused = pol.split_thresholds(ep, pol.scores(ep.obs), cal, 0.2)
    assert thresholds.shape == refused.shape == (2,)


@pytest.mark.parametrize(("method", "single"), [("cstop", False), ("cstop", True)])
def test_the_live_decision_stops_where_the_replay_stops(world, method, single):
    traces, ep = world
    pol = fit_policy(method, ep, np.arange(120), 0.2, seed=1, single=single)
    pol.calibrate(ep, np.arange(120, 200))
    test = np.arange(200, 240)
    reach, _ = pol.replay_answers(ep.subset(test))
    for i, q in enumerate(test):
        tr = traces[q]
        t = 0
        while True:
            t += 1
            d = decide(pol, tr.task, ep.horizon, tr.rounds[:t], pol.threshold, tr.family)
            if not d.go_on:
                break
        assert t == reach[i].sum()
