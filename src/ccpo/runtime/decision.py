"""The policy's decision after a live round: π(·|o_t), the action set C(o_t), and whether to
go on; and the horizon T a policy was trained on.

o_t is the last row of :func:`ccpo.traces.featurize.featurize_rounds` over rounds 1..t; the
action set is C(o_t) = {a : e(a|o_t) ≥ κ} with e from
:func:`ccpo.traces.episodes.effective_scores`, which builds in the empty-set fallback
{argmax π} and masks ``next`` at round T (the replay's definition, so the live agent decides as
the evaluation scores it). A point policy (``kappa=None``) acts greedily.

A single-answer policy (``policy.answer == "single"``, :mod:`ccpo.learning.single`) decides by
the replay's own rule: it stops at round t iff round t clears
(:func:`ccpo.traces.episodes.single_clears` on its stopping scores h, threshold ``kappa`` = λ̂);
going on, the action set is empty (no answer joins); stopping, it is the one answer action of
:func:`ccpo.traces.episodes.answer_actions`, so the agent returns exactly the replayed answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.policy import TrainedPolicy
from ccpo.traces.answers import normalizer_for
from ccpo.traces.episodes import (
    NEXT,
    answer_actions,
    single_clears,
)
from ccpo.traces.featurize import FEATURE_NAMES, featurize_rounds
from ccpo.traces.schema import ACTIONS

__all__ = ["RoundDecision", "decide", "policy_horizon"]


@dataclass(frozen=True)
class RoundDecision:
    """The policy's decision after round t: π(·|o_t), C(o_t), and whether to go on."""

    probs: np.ndarray  # [3]
    actions: tuple[str, ...]
    fallback: bool
    go_on: bool


def decide(
    policy: TrainedPolicy,
    task: str,
    horizon: int,
    rounds: Sequence[Any],
    kappa: float | None,
    family: str | None = None,
) -> RoundDecision:
    """C(o_t) for the last of ``rounds`` (t = len(rounds)); ``kappa=None``: greedy (point policy).

    The observations are padded to ``[T, F]`` so that ``next`` is masked exactly at round T;
    row t of π depends on row t of the observations only (the network is per-round).
    """
    t = len(rounds)
    if not 1 <= t <= horizon:
        raise ValueError(f"need 1..{horizon} rounds, got {t}")
    obs = np.zeros((horizon, len(FEATURE_NAMES)), dtype=np.float32)
    obs[:t] = featurize_rounds(task, horizon, rounds, family)
    if getattr(policy, "answer", "set") == "single":
        return _decide_single(policy, task, rounds, obs, kappa, family)
    p = policy.probs(obs)[t - 1]
    members, fallback = action_set(p.tolist(), t == horizon, kappa)
    acts = tuple(a for a, m in zip(ACTIONS, members, strict=True) if m)
    return RoundDecision(p, acts, fallback=fallback, go_on=members[NEXT])


def action_set(probs: list[float], last: bool, kappa: float | None) -> tuple[list[bool], bool]:
    """C(o_t) = {a : e(a|o_t) ≥ κ} for one round's π (``last``: round T, ``next`` masked) as
    :func:`~ccpo.traces.episodes.effective_scores` defines e (the first argmax of the
    allowed actions is in for every κ), on three floats rather than arrays (the agent asks
    every round); and whether that argmax is in only as the fallback (no allowed π ≥ κ).
    ``kappa=None``: κ = +inf (greedy)."""
    k = math.inf if kappa is None else float(kappa)
    allowed = [True, True, not last]
    masked = [v if ok else -math.inf for v, ok in zip(probs, allowed, strict=True)]
    top = masked.index(max(masked))
    members = [i == top or v >= k for i, v in enumerate(masked)]
    return members, not any(v >= k for v in masked)


def _decide_single(
    policy: Any, task: str, rounds: Sequence[Any], obs: np.ndarray, kappa, family
) -> RoundDecision:
    """The single-answer branch of :func:`decide` (``probs`` = (0, 0, 1) going on, the
    one-hot answer action at the stop; ``kappa=None``: the policy's own λ̂)."""
    t = len(rounds)
    lam = policy.kappa if kappa is None else float(kappa)
    h = policy.stop_scores(obs)  # row t depends on rows t, t − 1 only: as in the replay
    p = np.zeros(3)
    if not single_clears(h, lam)[t - 1]:
        p[NEXT] = 1.0
        return RoundDecision(p, (), fallback=False, go_on=True)
    norm = normalizer_for(task, family)
    last = rounds[-1]
    answered = np.array([norm(last.base.answer) != "", norm(last.guide.answer) != ""])
    a = int(answer_actions(answered[None])[0])
    p[a] = 1.0
    return RoundDecision(p, (ACTIONS[a],), fallback=False, go_on=False)


def policy_horizon(policy: TrainedPolicy, rounds: int | None = None) -> int:
    """T of the traces the policy was trained on, read back from its observation normalisation.

    The mean of the ``is_last_round`` feature over the training rounds is exactly 1/T. A
    ``rounds`` given by the user must agree with it.
    """
    inferred = getattr(policy, "horizon", None)  # stored by the stopping methods
    if inferred is None:
        i = FEATURE_NAMES.index("is_last_round")
        m = float(np.asarray(policy.obs_mean)[i])
        inferred = round(1.0 / m) if m > 0 else None
        if inferred is not None and abs(1.0 / inferred - m) > 1e-3:
            inferred = None
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
