"""The policy's decision after a live round: the action set, its fallback and the mask."""

from __future__ import annotations

import numpy as np

from ccpo.learning.policy import TrainedPolicy
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
