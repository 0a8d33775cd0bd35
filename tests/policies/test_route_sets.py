"""Routed answer sets: the set guarantee on held-out splits with the first decision in play,
and live = replay.

A CStop set policy and its router are fitted on 300 training questions of the label-free
4-model import (seed 3, 1000 questions; training draw seed 0) and τ is fixed at 0.6 before
calibration, so a third of the questions or more start after round 1. Split-conformal κ̂ on
the started views promises P(the set covers a correct answer) ≥ 1 − α marginally (α = 0.1);
over 200 random calibration/test halves of the other 700 (seed 1) the mean coverage must
reach 1 − α − 0.01 (slack: the mean of 200 correlated splits of 350), and an uncalibrated κ
(stop at the first round run) must break it, so the test can fail. Then ``dry-run`` against
the file's own replay endpoint: every served set, model paid and cost equals the replay's.
"""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.evaluation.dry_run import dry_run
from ccpo.evaluation.harness import load_episodes, trace_provenance
from ccpo.policies.registry import fit_policy, load_policy
from ccpo.policies.routing.sets import RoutedSetPolicy
from tests.helpers.routing import imported_ladder

ALPHA, N_TRAIN, SPLITS, TAU = 0.1, 300, 200, 0.6


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    folder = tmp_path_factory.mktemp("route-sets")
    traces, prices = imported_ladder(folder, n=1000, seed=3)
    ep, table = load_episodes(traces, [str(prices)])
    order = np.random.default_rng(0).permutation(ep.n)
    pol = fit_policy("cstop", ep, order[:N_TRAIN], ALPHA, 0, routed=True)
    assert isinstance(pol, RoutedSetPolicy)
    pol.tau, pol.taus = TAU, (TAU,)  # fixed before calibration
    rest = order[N_TRAIN:]
    rng = np.random.default_rng(1)
    perms = np.stack([rng.permutation(rest) for _ in range(SPLITS)])
    half = rest.size // 2
    return folder, traces, prices, table, ep, pol, perms[:, :half], perms[:, half:]


def test_the_set_guarantee_holds_with_routing_in_play(setting) -> None:
    *_, ep, pol, cal, test = setting
    view = pol.episode_scores(ep)
    assert (view.start > 0).mean() > 0.3  # routing is in play
    kappas, refused = pol.split_thresholds(ep, view, cal, ALPHA)
    assert not refused.any()
    m = pol.rollout(ep, view, kappas, test)
    assert m.covered.mean() >= 1 - ALPHA - 0.01
    ran_late = m.length < ep.horizon  # rounds run are counted from the start
    assert ran_late.mean() > 0.3
    first_only = pol.rollout(ep, view, np.ones(len(test)), test)  # κ = 1: stop at once
    assert first_only.covered.mean() < 1 - ALPHA - 0.05


def test_a_routed_set_serves_as_it_replays(setting) -> None:
    folder, traces, prices, table, ep, pol, cal, _ = setting
    pol.calibrate(ep, cal[0])
    pol.provenance = {**trace_provenance(traces), "alpha": ALPHA}
    pol.prices = table.to_price_file()
    pol.save(folder / "policy")
    loaded = load_policy(folder / "policy")
    assert isinstance(loaded, RoutedSetPolicy) and loaded.tau == TAU
    report = dry_run(folder / "policy", traces, {"prices": [str(prices)]}, n=200)
    assert report.ok, report.differences[:3]
    assert report.live_cost_usd == pytest.approx(report.replay_cost_usd, rel=0, abs=1e-12)
