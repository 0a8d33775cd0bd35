"""CCPO and the CPO family: π trained by :func:`ccpo.learning.training.train` (imported on
first use: loading or deciding never needs the trainer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ccpo.learning.config import TrainConfig
from ccpo.policies.auto import Fitter
from ccpo.policies.base import Policy
from ccpo.policies.rl import RLPolicy
from ccpo.policies.spec import PolicySpec, variant_name
from ccpo.traces.episodes import Episodes

NAMES = ("cpo", "cpo-batch", "cpo-online", "ccpo")
#: CCPO training steps per cross-fitting fold (and for the refit) inside ``auto``: K = 5 folds
#: and one refit, 6 × 300 steps, about as many as one default ``train --method ccpo``
AUTO_RL_STEPS = 300


def fit(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
    progress: Any = None,
) -> Policy:  # fmt: skip
    """π of ``spec.method`` trained on ``train_idx`` with ``spec.train_config`` (defaults
    otherwise; its method, α, seed and λ are the spec's); ``progress(step, entry)``."""
    from ccpo.learning.training import train  # the trainer: only for CCPO / CPO

    base = spec.train_config or TrainConfig()
    trainer = spec.technique.trainer
    assert trainer is not None
    cfg = replace(base, method=trainer, alpha=alpha, seed=seed, lam=spec.lam or base.lam)
    res = train(ep, np.asarray(train_idx), cfg, progress)
    return RLPolicy.from_result(res, variant_name(spec.method, cfg.lam))


def rl_fitter(method: str = "ccpo", steps: int = AUTO_RL_STEPS) -> Fitter:
    """A fitter training ``method`` (``ccpo``) for ``steps`` steps with the default
    :class:`TrainConfig` otherwise; scored as a batch (split-conformal κ̂) policy."""
    spec = PolicySpec(method, train_config=TrainConfig(steps=steps))
    return lambda ep, idx, alpha, seed: fit(spec, ep, idx, alpha, seed)
