"""CCPO (paper Algorithm 1) and its CPO baseline: :func:`train`, one loop per mode.

- :mod:`.exact` (``rollouts="exact"``, CCPO's default): exact expectations by replay, no
  sampling, no critics;
- :mod:`.sampled` (``rollouts="sampled"``, CPO's default ``cpo_rollouts``): the paper's loop,
  sampled paths and V-trace critics;
- :mod:`.update`: what both steps share (target policy, entropy bonus, the CPO update of π);
- :mod:`.run`: what both loops share around the step (split, normalisation, κ, checkpoints,
  :class:`TrainResult`).

Everything runs on replayed traces (no LLM calls), in float64 numpy, seeded and deterministic
on CPU. The final calibration on a calibration split is the caller's. Derivation and the
departures from the paper: docs/theory.md, section "Departures from CCPO/CPO".
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from ccpo.learning.config import TrainConfig
from ccpo.learning.training.exact import train_exact
from ccpo.learning.training.run import Progress, Run, TrainResult
from ccpo.learning.training.sampled import train_sampled

__all__ = ["TrainConfig", "TrainResult", "train"]


def train(
    ep, train_idx: np.ndarray, cfg: TrainConfig, progress: Progress | None = None
) -> TrainResult:
    """Train a CCPO (or CPO) policy on the episodes ``ep`` at ``train_idx``; ``progress(step,
    log entry)`` after every step."""
    rng = np.random.default_rng([cfg.seed, 0xCC90])
    # tiny matrices: one thread is faster (and training processes share the cores)
    with threadpool_limits(limits=1, user_api="blas"):
        run = Run(ep, np.asarray(train_idx), cfg, rng, progress)
        exact = (cfg.rollouts if cfg.method == "ccpo" else cfg.cpo_rollouts) == "exact"
        return train_exact(run) if exact else train_sampled(run)
