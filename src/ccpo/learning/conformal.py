"""Conformal calibration of the threshold κ of the conformal policy C(o) = {a : π(a|o) ≥ κ}.

Two pure pieces:

- :func:`split_conformal_threshold` — batch calibration (paper §4 "Threshold Calibration", last
  paragraph). Per calibration question the score s(q) is the largest κ at which the set-valued
  rollout still covers (:func:`ccpo.traces.episodes.covering_scores`). Coverage at κ is
  ``s ≥ κ``, so κ̂ = the ⌊α(n+1)⌋-th smallest score gives P(s_test ≥ κ̂) ≥ 1 − α for an
  exchangeable test question (ties only make it more conservative; κ̂ = 0 if the index is 0).
  The paper's 1e-6 grid search approximates this exact order statistic.
- :func:`online_threshold_update` — the online tracker of Angelopoulos, Barber & Bates (2024)
  used during CCPO training (paper Eq. ``ccpo_decay``) **with the sign corrected**: the paper
  writes κ ← κ + η(1 − covered − α), which shrinks the sets after a miss and diverges. The
  correct update is κ ← κ + η_k (covered − (1 − α)), equivalently q ← q + η(err − α) on the
  score 1 − π(a*|o) with κ = 1 − q. Steps decay as η_k = η_0 · k^(−1/2−ξ), ξ = 0.1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def check_alpha(alpha: float) -> None:
    """The miscoverage level α must lie in (0, 1): the one check of α (a ValueError; the
    product turns it into a usage error)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def split_conformal_threshold(scores: np.ndarray, alpha: float) -> np.ndarray:
    """κ̂ = the ⌊α(n+1)⌋-th smallest covering score along the last axis, clipped to [0, 1].

    ``scores`` [..., n] (may hold +inf for always-covered questions). Returns shape [...].
    """
    check_alpha(alpha)
    s = np.asarray(scores, dtype=np.float64)
    n = s.shape[-1]
    if n == 0:
        raise ValueError("split conformal needs at least one calibration score")
    k = int(np.floor(alpha * (n + 1)))
    if k == 0:
        return np.zeros(s.shape[:-1])
    kth = np.partition(s, k - 1, axis=-1)[..., k - 1]
    return np.clip(kth, 0.0, 1.0)


def min_calibration_size(alpha: float) -> int:
    """The fewest calibration questions n for which :func:`split_conformal_threshold` can
    return a κ̂ > 0 at level α: κ̂ is the k-th smallest score with k = ⌊α(n+1)⌋, and k = 0
    (κ̂ = 0: every action in every set) unless α(n+1) ≥ 1, i.e. n ≥ 1/α − 1 (n ≥ ⌈1/α⌉ − 1;
    α = 0.1: 9, α = 0.05: 19). Computed with the same floor as the threshold itself."""
    check_alpha(alpha)
    n = max(0, int(np.ceil(1.0 / alpha)) - 2)
    while int(np.floor(alpha * (n + 1))) < 1:
        n += 1
    return n


def decaying_step_size(k: int | np.ndarray, eta0: float, xi: float = 0.1) -> np.ndarray:
    """η_k = η_0 · k^(−1/2−ξ) for k ≥ 1 (Angelopoulos et al. 2024, Thm. 1; ξ ∈ (0, 1/2))."""
    k = np.asarray(k, dtype=np.float64)
    if np.any(k < 1):
        raise ValueError("step index k starts at 1")
    if not 0.0 < xi < 0.5:
        raise ValueError(f"xi must be in (0, 1/2), got {xi}")
    return eta0 * k ** (-0.5 - xi)


def online_threshold_update(kappa: float, covered: float, alpha: float, eta: float) -> float:
    """One corrected online step: κ ← clip(κ + η (covered − (1 − α)), 0, 1).

    ``covered`` is 1/0 for one episode, or the mean coverage of a batch of episodes. After a
    miss κ falls, so the sets {π ≥ κ} grow: the update moves toward coverage 1 − α.
    """
    check_alpha(alpha)
    return float(np.clip(kappa + eta * (covered - (1.0 - alpha)), 0.0, 1.0))


@dataclass
class OnlineThreshold:
    """Stateful wrapper of :func:`online_threshold_update` with decaying steps.

    >>> tr = OnlineThreshold(alpha=0.1, kappa=0.5, eta0=0.5)
    >>> tr.update(covered=0.0) < 0.5
    True
    """

    alpha: float
    kappa: float = 0.5
    eta0: float = 0.5
    xi: float = 0.1
    step: int = 0

    def update(self, covered: float) -> float:
        self.step += 1
        eta = float(decaying_step_size(self.step, self.eta0, self.xi))
        self.kappa = online_threshold_update(self.kappa, covered, self.alpha, eta)
        return self.kappa
