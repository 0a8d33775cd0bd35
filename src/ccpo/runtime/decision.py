"""The policy's decision after a live round, and the horizon T a policy was trained on.

o_t is the last row of :func:`ccpo.traces.featurize.featurize_rounds` over rounds 1..t (with
the signals of the policy's feature spec), padded to [T, F] so that ``next`` is masked
exactly at round T; the policy decides by
:meth:`ccpo.policies.base.Policy.decide`, the rule its replay scores (a set policy: C(o_t) =
{a : e(a|o_t) ≥ κ} with the empty-set fallback {argmax π}; a single-answer policy: stop at the
first round that clears λ̂ and return that round's one answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.policies.base import Policy, RoundDecision, action_set
from ccpo.traces.answers import normalizer_for
from ccpo.traces.featurize import featurize_rounds, spec_signals

__all__ = ["RoundDecision", "action_set", "decide", "policy_horizon"]


def decide(
    policy: Policy,
    task: str,
    horizon: int,
    rounds: Sequence[Any],
    kappa: float | None,
    family: str | None = None,
) -> RoundDecision:
    """The decision after the last of ``rounds`` (t = len(rounds)) at threshold ``kappa``
    (``None``: greedy for a set policy, λ̂ for a single-answer one)."""
    t = len(rounds)
    if not 1 <= t <= horizon:
        raise ValueError(f"need 1..{horizon} rounds, got {t}")
    rows = featurize_rounds(task, horizon, rounds, family, spec_signals(policy.feature_spec))
    obs = np.zeros((horizon, rows.shape[1]), dtype=np.float32)
    obs[:t] = rows

    def answered() -> tuple[bool, bool]:
        norm, last = normalizer_for(task, family), rounds[-1]
        return norm(last.base.answer) != "", norm(last.guide.answer) != ""

    return policy.decide(obs, t, kappa, answered)


def policy_horizon(policy: Policy, rounds: int | None = None) -> int:
    """T of the traces the policy was trained on; a ``rounds`` given by the user must agree
    with it."""
    inferred = policy.trained_horizon()
    if rounds is not None:
        if inferred is not None and rounds != inferred:
            raise CCPOError(
                f"rounds: {rounds} in the config, but the policy was trained on T = {inferred} "
                "rounds; its observations (round index) only make sense with T = "
                f"{inferred}"
            )
        return rounds
    if inferred is None:
        raise CCPOError("cannot tell T from the policy artifact; set rounds: T in the config")
    return inferred
