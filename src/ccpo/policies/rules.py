"""Fixed rules: stopping schedules with nothing to learn, calibrated like any policy.

- ``depth-k`` (sets): g_t = 1 − t/T, so C_κ runs the least k rounds with 1 − k/T < κ;
  (single answer): h_t = t/T, so λ picks a fixed depth.
- ``agree-k``: stop as soon as the guide agrees with the base answer, at most k rounds.

Both are nested in the threshold, so split conformal (sets) or Learn-then-Test (single
answer) calibrates k (docs/theory.md, "depth-k and agree-k").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ccpo.policies.cstop import StoppingPolicy
from ccpo.traces.featurize import FEATURE_NAMES

#: the fixed rules (nothing to learn; the threshold still calibrates them)
FIXED_RULES = ("depth-k", "agree-k")


def depth_schedule(horizon: int) -> np.ndarray:
    """``depth-k`` in the same family: g_t = 1 − t/T, so C_κ runs the least k rounds with
    1 − k/T < κ and returns every answer of them. Split-conformal κ̂ then picks the least depth
    whose calibration coverage reaches the conformal level (shape [T])."""
    return 1.0 - np.arange(1, horizon + 1) / horizon


def agree_schedule(obs: np.ndarray) -> np.ndarray:
    """``agree-k``, the rule a practitioner tries first: stop as soon as the guide agrees with
    the base answer (verdict yes), else go on, at most k rounds: g_t = (1 − yes_t)(1 − t/T).
    Nested in κ (a lower κ only raises the cap k), so split conformal calibrates k; when
    stopping on agreement alone misses the level, κ̂ = 0 runs every round. ``obs`` [..., T, F]."""
    yes = np.asarray(obs)[..., FEATURE_NAMES.index("verdict_yes")] > 0.5
    return np.where(yes, 0.0, depth_schedule(obs.shape[-2]))


def depth_scores(horizon: int) -> np.ndarray:
    """``depth-k`` single: h_t = t/T, so λ picks a fixed depth (shape [T])."""
    return np.arange(1, horizon + 1) / horizon


@dataclass
class RulePolicy(StoppingPolicy):
    """A fixed rule as a set policy: ``depth-k`` or ``agree-k`` (``variant``), no classifier
    (``model`` None); κ̂ by split conformal like CStop."""

    variant: str = "depth-k"

    def _continuation(self, obs: np.ndarray) -> np.ndarray:
        if self.variant == "agree-k":
            return agree_schedule(obs)
        return np.broadcast_to(depth_schedule(self.horizon), obs.shape[:-1]).copy()
