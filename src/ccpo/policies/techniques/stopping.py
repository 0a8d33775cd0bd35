"""CStop (``cstop``, ``cstop-lr``) and the fixed rules (``depth-k``, ``agree-k``), fitted on
replayed traces: membership scores of a set policy (:mod:`ccpo.policies.cstop`,
:mod:`ccpo.policies.rules`) or the stopping score of a single answer
(:mod:`ccpo.policies.single`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import StopConfig
from ccpo.policies.auto import Fitter
from ccpo.policies.base import Policy
from ccpo.policies.cstop import STOPPING_METHODS, fit_stopping
from ccpo.policies.rules import FIXED_RULES, RulePolicy
from ccpo.policies.single import fit_single
from ccpo.policies.spec import PolicySpec
from ccpo.traces.episodes import Episodes

NAMES = (*STOPPING_METHODS, *FIXED_RULES)
#: the methods fitted on replayed traces (membership scores of a set policy)
SCORE_METHODS = NAMES


def fit(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
    progress: Any = None,
) -> Policy:  # fmt: skip
    """The set policy (or, ``spec.single``, the single-answer one) of ``spec.method``."""
    if spec.single:
        return single_fitter(spec.method, spec.settings, spec.delta)(ep, train_idx, alpha, seed)
    return stopping_fitter(spec.method, spec.settings)(ep, train_idx, alpha, seed)


def stopping_fitter(method: str, settings: Mapping[str, Any] | None = None) -> Fitter:
    """(ep, idx, α, seed) → fitted set policy for a CStop method or a fixed rule;
    ``settings``: other :class:`StopConfig` fields (the learner's hyperparameters)."""
    kw = dict(settings or {})
    if method in FIXED_RULES:
        return lambda ep, idx, alpha, seed: RulePolicy(
            None, ep.horizon, StopConfig(alpha=alpha, seed=seed, **kw), variant=method
        )
    if method not in STOPPING_METHODS:
        raise CCPOError(f"unknown method '{method}' (stopping methods: {', '.join(NAMES)})")
    kw["learner"] = STOPPING_METHODS[method]
    return lambda ep, idx, alpha, seed: fit_stopping(
        ep, idx, StopConfig(alpha=alpha, seed=seed, **kw), variant=method
    )


def single_config(settings: Mapping[str, Any] | None, alpha: float, seed: int) -> StopConfig:
    """The :class:`StopConfig` of a single-answer fit (its learner is the method's)."""
    kw = {k: v for k, v in (settings or {}).items() if k not in ("alpha", "seed", "learner")}
    return StopConfig(alpha=alpha, seed=seed, **kw)


def single_fitter(method: str, settings: Mapping[str, Any] | None, delta: float) -> Fitter:
    """(ep, idx, α, seed) → the single-answer policy of ``method``, not calibrated yet."""
    return lambda ep, idx, alpha, seed: fit_single(
        ep, idx, single_config(settings, alpha, seed), method, delta
    )
