"""What every set-valued policy shares: membership scores e(a|o_t), split-conformal κ̂.

A set policy returns C_κ(o_t) = {a : e(a|o_t) ≥ κ} (the argmax always in), goes on while
``next`` is in the set, and is calibrated by split conformal prediction on covering scores:
P(the set covers a correct answer) ≥ 1 − α, marginally over exchangeable calibration and test
questions (docs/theory.md, "Split-conformal κ̂ (set policies)"). :class:`SetPolicy` implements
the :class:`~ccpo.policies.base.Policy` methods on top of ``probs``; the techniques
(:mod:`ccpo.policies.rl`, :mod:`ccpo.policies.cstop`) say how e is computed.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from ccpo.learning.conformal import CalibrationScores, split_conformal_threshold
from ccpo.learning.replay import calibrate_kappa
from ccpo.policies.base import Answered, Calibration, Policy, RoundDecision, action_set
from ccpo.traces.episodes import (
    NEXT,
    Episodes,
    Metrics,
    conformal_rollout,
    conformal_sets,
    covering_scores,
)
from ccpo.traces.schema import ACTIONS


class SetPolicy(Policy):
    """A policy returning answer sets C_κ(o_t) of its membership scores :meth:`probs`."""

    answer = "set"
    config: Any  # TrainConfig or StopConfig: α and the online tracker's steps
    kappa_batch: float | None  # κ̂ by split conformal (None: not calibrated)
    calibration: CalibrationScores | None  # κ̂'s covering scores (online level tracker)

    @abstractmethod
    def probs(self, obs: np.ndarray) -> np.ndarray:
        """Membership scores e(a|o) [..., T, 3] for observations [..., T, F]."""

    @property
    def alpha(self) -> float:
        return self.config.alpha

    @property
    def threshold(self) -> float | None:
        return None if self.greedy else self.kappa

    @property
    @abstractmethod
    def kappa(self) -> float:
        """κ in force."""

    def set_threshold(self, value: float) -> None:
        self.kappa_batch = float(value)

    @property
    def is_calibrated(self) -> bool:
        """κ̂ is set, or the policy calibrates none (greedy, or the online κ of training)."""
        return self.kappa_batch is not None or not self.calibrates

    def scores(self, obs: np.ndarray) -> np.ndarray:
        return self.probs(obs)

    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        """Split-conformal κ̂ of the covering scores (kept in ``calibration`` for the online
        tracker)."""
        scores = covering_scores(ep, self.probs(ep.obs))
        scores = scores if cal is None else scores[cal]
        self.kappa_batch = float(split_conformal_threshold(scores, self.alpha))
        self.calibration = CalibrationScores.from_scores(scores)
        return Calibration(self.kappa_batch, None, len(scores))

    def split_thresholds(
        self, ep: Episodes, scores: np.ndarray, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        return calibrate_kappa(ep, scores, alpha, cal), np.zeros(len(cal), dtype=bool)

    def rollout(
        self, ep: Episodes, scores: np.ndarray, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        return conformal_rollout(ep, scores, thresholds, idx)

    def replay_answers(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray]:
        return conformal_sets(ep, self.probs(ep.obs), self.kappa)

    def decide(
        self, obs: np.ndarray, t: int, threshold: float | None, answered: Answered
    ) -> RoundDecision:
        """C(o_t) for round t; π of the padded observations [T, F], so that ``next`` is
        masked exactly at round T and row t is computed as in the replay."""
        p = self.probs(obs)[t - 1]
        members, fallback = action_set(p.tolist(), t == obs.shape[0], threshold)
        acts = tuple(a for a, m in zip(ACTIONS, members, strict=True) if m)
        return RoundDecision(p, acts, fallback=fallback, go_on=members[NEXT])
