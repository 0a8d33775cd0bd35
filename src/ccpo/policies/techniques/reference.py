"""``always-<reference>``: call the reference model alone (:mod:`ccpo.policies.reference`);
nothing to learn. ``auto`` keeps it when no candidate is cheaper."""

from __future__ import annotations

from typing import Any

import numpy as np

from ccpo.learning.config import StopConfig
from ccpo.policies.auto import Direct
from ccpo.policies.base import Policy
from ccpo.policies.reference import (
    METHOD,
    ReferencePolicy,
    callable_alone,
    reference_name,
    reference_validator,
)
from ccpo.policies.single import DELTA
from ccpo.policies.spec import PolicySpec
from ccpo.policies.techniques.stopping import single_config
from ccpo.traces.episodes import Episodes

NAMES = (METHOD,)


def fit(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
    progress: Any = None,
) -> Policy:  # fmt: skip
    """The policy calling these traces' reference model alone, of ``spec``'s answer kind."""
    single = single_config(spec.settings, alpha, seed) if spec.single else None
    cfg = single or StopConfig(alpha=alpha, seed=seed)
    return ReferencePolicy.fit(ep, spec.answer, cfg, spec.delta)


def reference_candidate(
    ep: Episodes, alpha: float, on: bool = True, delta: float | None = DELTA,
    like: int | None = None,
) -> dict[str, Direct]:  # fmt: skip
    """``auto``'s ``always-<reference>`` candidate, where these traces can call that model
    alone; none when ``on`` is false. ``delta`` None: tested as the marginal guarantee
    calibrates it; ``like``: at the miss rate allowed on that many calibration questions."""
    if not (on and callable_alone(ep)):
        return {}
    figures = reference_validator(alpha, delta, like)

    def with_latency(sub: Episodes) -> tuple[float, ...]:
        known = sub.strongest_latency is not None and sub.n > 0
        return (*figures(sub), float(np.mean(sub.strongest_latency)) if known else float("nan"))

    return {reference_name(ep.strongest): with_latency}
