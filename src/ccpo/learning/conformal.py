"""Conformal calibration of the threshold κ of the conformal policy C(o) = {a : π(a|o) ≥ κ}.

- :func:`split_conformal_threshold`: batch calibration, κ̂ = the ⌊α(n+1)⌋-th smallest covering
  score (:func:`ccpo.traces.episodes.covering_scores`), exact where the paper searches a grid;
  :func:`min_calibration_size`, :func:`check_alpha`.
- :func:`online_threshold_update`, :func:`decaying_step_size`, :class:`OnlineThreshold`: the
  online κ tracker, with the paper's sign corrected (CCPO training, and deployment for a policy
  without calibration scores).
- :func:`bounded_step_size`: deployment bounds η, never the step, so that the fixed point stays
  at coverage 1 − α.
- :class:`CalibrationScores`: the covering scores a policy keeps; deployment moves the level u
  and sets κ = Q(u) (adaptive conformal inference).
- :func:`coverage_interval`, :func:`short_beyond_noise`: Clopper–Pearson, "short beyond noise".

Derivation: docs/theory.md, sections "Split-conformal κ̂ (set policies)", "Online κ (ACI)" and
'Checking coverage: Clopper–Pearson and "within noise"'.
"""

from __future__ import annotations

import functools
import math
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


def online_threshold_update(
    kappa: float, covered: float, alpha: float, eta: float, lower: float = 0.0, upper: float = 1.0
) -> float:
    """One corrected online step: κ ← clip(κ + η (covered − (1 − α)), lower, upper).

    ``covered`` is 1/0 for one episode, or the mean coverage of a batch of episodes. After a
    miss κ falls, so the sets {π ≥ κ} grow: the update moves toward coverage 1 − α.
    """
    check_alpha(alpha)
    return float(np.clip(kappa + eta * (covered - (1.0 - alpha)), lower, upper))


def bounded_step_size(eta: float, alpha: float, max_delta: float) -> float:
    """η limited so that no step exceeds ``max_delta``: min(η, max_delta / max(α, 1 − α)).

    Both step directions shrink by the same factor, so the fixed point stays at coverage
    1 − α (docs/theory.md, "Online κ (ACI)"); clamping the step itself would move it."""
    check_alpha(alpha)
    if max_delta <= 0:
        raise ValueError(f"max_delta must be > 0, got {max_delta}")
    return min(eta, max_delta / max(alpha, 1.0 - alpha))


def coverage_interval(covered: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) two-sided interval for a coverage rate measured as
    ``covered`` of ``n``: P(interval ∋ true rate) ≥ ``level`` for every true rate."""
    if n <= 0 or not 0 <= covered <= n:
        raise ValueError(f"need 0 <= covered <= n and n > 0, got {covered} of {n}")
    from scipy.stats import beta

    tail = (1.0 - level) / 2.0
    lo = 0.0 if covered == 0 else float(beta.ppf(tail, covered, n - covered + 1))
    hi = 1.0 if covered == n else float(beta.ppf(1.0 - tail, covered + 1, n - covered))
    return lo, hi


@functools.lru_cache(maxsize=4096)  # a server asks the same few (k, n) on every feedback
def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Bin(n, p) ≤ k), summed in log space: exact up to rounding, and without scipy (whose
    import takes seconds on a busy machine, too long for a server's event loop)."""
    if k >= n or p <= 0.0:
        return 1.0
    if k < 0 or p >= 1.0:
        return 0.0
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    logs = [top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
            for i in range(k + 1)]  # fmt: skip
    m = max(logs)
    return min(1.0, math.exp(m) * math.fsum(math.exp(x - m) for x in logs))


def short_beyond_noise(covered: int, n: int, alpha: float, level: float = 0.95) -> bool:
    """Coverage ``covered`` / ``n`` is below 1 − α beyond noise: the whole Clopper-Pearson
    interval at ``level`` lies below 1 − α (a one-sided exact binomial test at (1 − level)/2).
    The interval's upper end u solves P(Bin(n, u) ≤ covered) = (1 − level)/2 and that
    probability falls as the rate grows, so u < 1 − α exactly when P(Bin(n, 1 − α) ≤
    covered) < (1 − level)/2: one binomial sum, no quantile (and no scipy)."""
    check_alpha(alpha)
    if n <= 0 or covered >= n:
        return False
    return binomial_cdf(covered, n, 1.0 - alpha) < (1.0 - level) / 2.0


@dataclass(frozen=True)
class CalibrationScores:
    """The calibration covering scores an artifact keeps, for the level tracker
    (docs/theory.md, "Online κ (ACI)"): ``below`` the scores under 1 in increasing order,
    ``n`` how many there were in all (the others are ≥ 1: covered at every κ).
    :meth:`kappa` at level α is exactly :func:`split_conformal_threshold` of the scores."""

    below: tuple[float, ...]
    n: int

    @classmethod
    def from_scores(cls, scores: np.ndarray) -> CalibrationScores:
        s = np.asarray(scores, dtype=np.float64).ravel()
        if s.size == 0:
            raise ValueError("no calibration scores")
        return cls(tuple(float(x) for x in np.sort(s[s < 1.0])), int(s.size))

    def kappa(self, level: float) -> float:
        """Q(u): the ⌊u(n + 1)⌋-th smallest score clipped to [0, 1] (0 below index 1)."""
        k = int(np.floor(level * (self.n + 1)))
        if k <= 0:
            return 0.0
        return max(0.0, self.below[k - 1]) if k <= len(self.below) else 1.0

    def level_of(self, kappa: float) -> float:
        """A level u with Q(u) ≥ ``kappa`` one grid step above a level where Q < ``kappa``:
        the middle of the grid cell [k/(n + 1), (k + 1)/(n + 1)) of the smallest such k (the
        middle, so that floating point cannot drop u into the cell below); a κ restored from
        a tracker that moved κ itself."""
        k = int(np.searchsorted(np.asarray(self.below), kappa, side="left")) + 1
        return min(1.0, (k + 0.5) / (self.n + 1))

    def to_json(self) -> dict:
        return {"below": list(self.below), "n": self.n}

    @classmethod
    def from_json(cls, d: dict | None) -> CalibrationScores | None:
        if not d:
            return None
        return cls(tuple(float(x) for x in d["below"]), int(d["n"]))


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
    level: float | None = None  # u of the level tracker (None: κ moves itself)

    def _eta(self, max_step: int | None, max_delta: float | None) -> float:
        """Advance the step count; η_k = η_0 · min(k, ``max_step``)^(−1/2−ξ) (frozen after
        ``max_step`` steps: tracks drift; None: the training schedule), bounded so that no
        step exceeds ``max_delta`` (:func:`bounded_step_size`)."""
        self.step += 1
        if max_step is not None:
            self.step = min(self.step, max_step)
        eta = float(decaying_step_size(self.step, self.eta0, self.xi))
        return eta if max_delta is None else bounded_step_size(eta, self.alpha, max_delta)

    def update(
        self,
        covered: float,
        scores: CalibrationScores | None = None,
        *,
        max_step: int | None = None,
        max_delta: float | None = None,
        lower: float = 0.0,
        upper: float = 1.0,
    ) -> float:
        """One step of what the tracker moves (:meth:`position`) with η_k of :meth:`_eta`,
        kept in [``lower``, ``upper``]: κ itself, or with ``scores`` the level u (the level
        tracker, docs/theory.md, "Online κ (ACI)"), and then κ = Q(u) of ``scores``.
        :meth:`update_level` is another name for it (called with ``scores``).

        >>> cal = CalibrationScores.from_scores(np.linspace(0.05, 0.95, 19))
        >>> tr = OnlineThreshold(alpha=0.1, kappa=cal.kappa(0.1), eta0=0.5, level=0.1)
        >>> tr.update_level(0.0, cal, max_delta=0.05) < cal.kappa(0.1)
        True
        """
        value = self.position(scores)
        eta = self._eta(max_step, max_delta)
        value = online_threshold_update(value, covered, self.alpha, eta, lower, upper)
        if scores is None:
            self.kappa = value
        else:
            self.level = value
            self.kappa = scores.kappa(value)
        return self.kappa

    update_level = update

    def position(self, scores: CalibrationScores | None) -> float:
        """What the tracker moves: κ (no ``scores``), else the level u, taken from κ the first
        time (a tracker restored from one that moved κ itself)."""
        if scores is None:
            return self.kappa
        if self.level is None:
            self.level = scores.level_of(self.kappa)
        return self.level

    def eta(self, max_step: int | None = None) -> float:
        """The η_k the next :meth:`update` takes before any bound."""
        k = self.step + 1 if max_step is None else min(self.step + 1, max_step)
        return float(decaying_step_size(k, self.eta0, self.xi))
