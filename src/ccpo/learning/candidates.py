"""What ``--method auto`` may choose among: every score method of
:mod:`ccpo.learning.stopping` (cheap to cross-fit) and CCPO, trained on exact expectations by
replay (:mod:`ccpo.learning.trainers`) for a bounded number of steps per fold.

Each candidate is a *fitter*, (episodes, question indices, α, seed) → a scorer with
``probs(obs)``, and :func:`ccpo.learning.stopping.select_method` cross-fits every one the same
way on the training questions only, so adding a candidate leaves the conformal guarantee of
the calibrated choice untouched (the calibration split is never seen by the selection).

**Bounded time.** CCPO is cross-fitted with :data:`AUTO_RL_STEPS` training steps per fold
(``StopConfig.auto_ccpo_steps``, ``train --auto-ccpo-steps``; 0 leaves CCPO out): K = 5 folds,
then one refit on all training questions if it wins, 6 × 300 = 1,800 steps, about as many as
one default ``train --method ccpo`` (2,000 steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ccpo.traces.episodes import Episodes

AUTO_RL_STEPS = 300
"""CCPO training steps per cross-fitting fold (and for the refit) inside ``auto``."""
RL_CANDIDATES = ("ccpo",)
"""Candidates of ``auto`` trained by :func:`ccpo.learning.trainers.train`."""


def rl_fitter(method: str = "ccpo", steps: int = AUTO_RL_STEPS):
    """A fitter training ``method`` (``ccpo``) for ``steps`` steps with the default
    :class:`~ccpo.learning.config.TrainConfig` otherwise; the result is scored as a batch
    (split-conformal κ̂) policy, like every other candidate."""

    def fit(ep: Episodes, idx: np.ndarray, alpha: float, seed: int) -> Any:
        from ccpo.learning.config import TrainConfig
        from ccpo.learning.policy import TrainedPolicy
        from ccpo.learning.trainers import train  # torch: only when CCPO is a candidate

        cfg = TrainConfig(method=method, alpha=alpha, seed=seed, steps=steps)
        return TrainedPolicy.from_result(train(ep, np.asarray(idx), cfg), method)

    return fit
