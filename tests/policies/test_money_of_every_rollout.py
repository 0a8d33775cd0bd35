"""Every kind of policy says which steps it ran and returned, and the rungs account for its
whole cost: on the label-free 4-model import (synthetic table, 300 questions, seed 3; a
cascade of pairs, so a later round's base repeats the earlier guide), for a single answer,
a routed single answer, a set, a routed set and ``always-<reference>``, per question the
spend on the rungs paid equals the replay's cost, a returned rung is a paid one, and the
steps match what the policy returns (``replay_answers``, the API's and dry-run's view)."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.evaluation.harness import load_episodes
from ccpo.evaluation.money import money_flow
from ccpo.learning.config import StopConfig
from ccpo.policies.reference import ReferencePolicy
from ccpo.policies.registry import fit_policy
from ccpo.traces.episodes import returned_answers
from ccpo.traces.rungs import rung_masks
from tests.helpers.routing import imported_ladder

ALPHA, TAU = 0.2, 0.6  # τ fixed by hand so that routing is in play


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    traces, prices = imported_ladder(tmp_path_factory.mktemp("money"), n=300, seed=3)
    ep, _ = load_episodes(traces, [str(prices)])
    return ep, np.arange(0, ep.n, 2), np.arange(1, ep.n, 2)


@pytest.fixture(scope="module")
def policies(ladder):
    ep, train, cal = ladder
    out = {
        "single": fit_policy("cstop-lr", ep, train, ALPHA, 0, single=True),
        "routed single": fit_policy("cstop-lr", ep, train, ALPHA, 0, single=True, routed=True),
        "set": fit_policy("cstop", ep, train, ALPHA, 0),
        "routed set": fit_policy("cstop", ep, train, ALPHA, 0, routed=True),
        "reference": ReferencePolicy.fit(ep, "single", StopConfig(alpha=ALPHA)),
    }
    for name, pol in out.items():
        if "routed" in name:
            pol.tau, pol.taus = TAU, (TAU,)
        pol.calibrate(ep, cal)
    return out


def test_the_rungs_account_for_every_policy_kind_cost(ladder, policies):
    ep, _, _ = ladder
    R = ep.rungs.count
    assert ep.horizon + 1 == R and ep.rungs.models[-1] == ep.strongest
    started_late = 0
    for name, pol in policies.items():
        scores = pol.episode_scores(ep)
        m = pol.rollout(ep, scores, pol.threshold)
        paid = rung_masks(ep.rungs.of_step, m.called, R)
        ret = rung_masks(ep.rungs.of_step, m.returned, R)
        np.testing.assert_allclose((paid * ep.rungs.cost).sum(-1), m.cost, rtol=1e-12, err_msg=name)
        assert not (ret & ~paid).any(), name
        reach, included = pol.replay_answers(ep)
        assert np.array_equal(m.called.any(-1), reach), name
        got = returned_answers(ep, included) if pol.answer == "set" else included
        assert np.array_equal(m.returned, got), name
        if pol.answer == "single":
            assert (m.returned.sum((-1, -2)) == 1).all(), name
        if "routed" in name:  # started at round s + 1, the first rung paid is rung s
            start = np.argmax(reach, axis=1)  # (round s's guide, repeated by round s + 1)
            assert np.array_equal(np.argmax(paid, axis=1), start), name
            started_late = max(started_late, int((start > 0).sum()))
        if name == "reference":
            assert paid[:, -1].all() and not paid[:, :-1].any() and ret[:, -1].all()
        f = money_flow(ep, m)
        assert f.total_usd == pytest.approx(f.spend.sum(), rel=1e-12), name
    assert started_late >= 30  # routing is in play


def test_evaluation_splits_give_the_same_figures_as_their_questions(ladder, policies):
    """[K, n] splits with one threshold per split: the flow is the mean over every question
    drawn, as if each split's questions were replayed alone."""
    ep, _, cal = ladder
    pol = policies["routed single"]
    scores = pol.episode_scores(ep)
    idx = np.stack([cal[:50], cal[50:100]])
    th = np.tile([pol.tau, pol.threshold], (2, 1))
    split = money_flow(ep, pol.rollout(ep, scores, th, idx), idx)
    alone = pol.rollout(ep.subset(idx.ravel()), pol.episode_scores(ep.subset(idx.ravel())),
                        pol.threshold)  # fmt: skip
    one = money_flow(ep.subset(idx.ravel()), alone)
    assert split.questions == one.questions == 100
    np.testing.assert_allclose(split.paid, one.paid)
    np.testing.assert_allclose(split.returned, one.returned)
    np.testing.assert_allclose(split.unreturned, one.unreturned)
