"""The policy's decision after a live round: the action set, its fallback and the mask."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.policies.rl import TrainedPolicy
from ccpo.runtime.decision import decide
from ccpo.traces.episodes import NEXT


def test_decide_fallback_and_mask(policy_dir):
    pol = TrainedPolicy.load(policy_dir)

    class U:
        input_tokens, output_tokens = 10, 5

    class B:
        answer, usage, logprob_mean, logprob_min = "A", U(), -0.5, -1.0

    class G:
        answer, verdict, uncertainty, usage = "B", "no", 0.2, U()

    class R:
        base, guide = B(), G()

    rounds = [R()] * 4
    d = decide(pol, "mmlu", 4, rounds, kappa=1.0)  # nothing reaches κ = 1: fallback to argmax
    assert d.fallback and len(d.actions) == 1 and d.actions[0] != "next" and not d.go_on
    assert d.probs[NEXT] == 0.0  # `next` masked at round T
    d0 = decide(pol, "mmlu", 4, rounds[:1], kappa=0.0)
    assert d0.actions == ("base", "guide", "next") and d0.go_on
    greedy = decide(pol, "mmlu", 4, rounds[:2], kappa=None)  # point policy: argmax only
    assert greedy.actions == (("base", "guide", "next")[int(np.argmax(greedy.probs))],)


def test_action_set_is_the_replays_effective_score_rule():
    """The agent's per-round action set on three floats equals the replay's array definition
    (effective_scores: argmax of the allowed actions always in, ``next`` masked at round T)
    for random π, ties and every κ kind (seed 0, 3,000 draws)."""
    from ccpo.runtime.decision import action_set
    from ccpo.traces.episodes import allowed_actions, effective_scores

    rng = np.random.default_rng(0)
    for i in range(3000):
        p = rng.dirichlet(np.ones(3))
        if i % 7 == 0:  # ties, and exact hits of κ
            p = np.round(p, 1)
        last = bool(i % 2)
        allowed = allowed_actions(4)[3 if last else 0]
        if last:
            p[NEXT] = 0.0
        kappa = (None, 0.0, float(p[i % 3]), float(rng.uniform()), 1.0, -np.inf)[i % 6]
        k = np.inf if kappa is None else kappa
        e = effective_scores(p, allowed)
        members, fallback = action_set(p.tolist(), last, kappa)
        assert members == list(e >= k), (p, last, kappa)
        assert fallback == (not (allowed & (p >= k)).any()), (p, last, kappa)


def test_allowed_actions_cannot_be_changed_by_a_caller():
    from ccpo.traces.episodes import allowed_actions

    m = allowed_actions(3)
    assert allowed_actions(3) is m and not m[2, NEXT] and m[:2].all()
    with pytest.raises(ValueError):
        m[0, 0] = False
