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

**Bound η, never the step (the fixed point).** Deployment bounds how far one feedback may move
κ. A step is η(covered − (1 − α)): +ηα after a covered question, −η(1 − α) after a miss. On a
stationary stream covered with probability p(κ) (p falls as κ rises: smaller sets), the mean
step is η(p(κ) − (1 − α)), zero exactly where p(κ) = 1 − α. Clamping *the step* to ±d breaks
this: once η(1 − α) > d ≥ ηα the mean step is p·ηα − (1 − p)·d, zero at p = d/(d + ηα) < 1 − α
(α = 0.1, η = 0.0208, d = 0.01: p = 0.826), so κ settles where coverage is below target.
Bounding *η* instead, η ≤ η_max = d / max(α, 1 − α) (:func:`bounded_step_size`), keeps every
step within ±d and multiplies both directions by the same factor, so the mean step keeps the
sign of p(κ) − (1 − α) for every η_0, d, ξ and freeze point: the fixed point is coverage 1 − α
(the band [lower, upper] is a projection, so κ goes to the band edge nearest the fixed point
when it lies outside). With η frozen at a constant the tracker is the adaptive conformal
inference of Gibbs & Candès (2021): the long-run miss rate is within (B + η)/(ηK) of α after K
feedbacks, B the band width, on any stream. :func:`coverage_interval` is the Clopper-Pearson
interval used to say when measured coverage is short of 1 − α beyond noise.

**Online κ in calibration-quantile units (deployment).** A tracker that moves κ itself crosses
a flat stretch of the coverage curve p(κ) slowly: its mean step η(p(κ) − (1 − α)) is small
wherever p barely changes with κ, so after a shift that needs κ far from κ̂ (bundled subject
shift: κ̂ = 0.80 covers 0.83 of the new traffic, 1 − α = 0.9 needs κ = 0.22) it is still on the
way after a thousand feedbacks. Deployment therefore runs the adaptive conformal inference of
Gibbs & Candès (2021) in its original form, on the *level*: u ← u + η_k (covered − (1 − α)),
κ = Q(u), where Q(u) is the split-conformal threshold at level u on the n calibration scores
the artifact keeps (:class:`CalibrationScores`): the ⌊u(n + 1)⌋-th smallest score, 0 below
index 1 (every action), 1 above n. Q is non-decreasing and Q(α) = κ̂ exactly, so the tracker
starts at κ̂. What it guarantees:

1. *Fixed point.* p(Q(u)) is non-increasing in u (a higher level, a higher κ, smaller sets), so
   the mean step η(p(Q(u)) − (1 − α)) has the sign of the coverage gap for every η: u drifts
   toward the levels where coverage is 1 − α, whatever the stream's coverage curve; the band is
   a projection onto [α − band, α + band], so u goes to its edge when the fixed point lies
   outside (u may leave [0, 1]: Q(u) = 0 below, every action, and 1 above). Bounding η
   (above) keeps this.
2. *Long-run coverage on any stream.* Summing the steps telescopes: with η constant (after the
   freeze) and no projection over feedbacks 1..K, Σ_k (covered_k − (1 − α)) = (u_{K+1} −
   u_1)/η, so the miss rate over any K consecutive feedbacks is within (band·2)/(ηK) of α — no
   exchangeability needed (Gibbs & Candès 2021, Prop. 4.1, with the band as the range of u).
   The projection only binds at an edge, where coverage is short (lower edge) or above target
   (upper edge) by the operator's choice of band.
3. *Speed.* In level units the slope of p(Q(u)) is about 1 where the traffic orders questions
   as calibration did, so the gap shrinks by a factor ≈ (1 − η) per feedback instead of
   (1 − η·|dp/dκ|): with η = 0.011 (the default bound) in about a hundred feedbacks.
   ``benchmarks/bench_shift.py`` (10 seeded streams of 1,300 feedbacks, coverage over the
   second half, α = 0.1, ``kappa_eta0: 0.5``): on the subject shift above 0.899 (lowest
   0.894) against 0.863 (0.846) for the κ tracker and 0.824 for fixed κ̂; without a shift
   (calibrated on 140 questions, served on 140 others) 0.900 (0.892) against 0.872 (0.786)
   for fixed κ̂, whose small calibration set draws badly now and then.

A policy without calibration scores (saved before they were kept, or CCPO's online κ) keeps the
κ tracker; the two share :func:`online_threshold_update`.
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
    1 − α (module docstring); clamping the step itself would move it."""
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


def short_beyond_noise(covered: int, n: int, alpha: float, level: float = 0.95) -> bool:
    """Coverage ``covered`` / ``n`` is below 1 − α beyond noise: the whole Clopper-Pearson
    interval at ``level`` lies below 1 − α (a one-sided exact binomial test at (1 − level)/2)."""
    check_alpha(alpha)
    return n > 0 and coverage_interval(covered, n, level)[1] < 1.0 - alpha


@dataclass(frozen=True)
class CalibrationScores:
    """The calibration covering scores an artifact keeps, for the level tracker (module
    docstring): ``below`` the scores under 1 in increasing order, ``n`` how many there were in
    all (the others are ≥ 1: covered at every κ). :meth:`kappa` at level α is exactly
    :func:`split_conformal_threshold` of the scores."""

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
        *,
        max_step: int | None = None,
        max_delta: float | None = None,
        lower: float = 0.0,
        upper: float = 1.0,
    ) -> float:
        """One step of κ with η_k of :meth:`_eta`, κ kept in [``lower``, ``upper``]."""
        eta = self._eta(max_step, max_delta)
        self.kappa = online_threshold_update(self.kappa, covered, self.alpha, eta, lower, upper)
        return self.kappa

    def update_level(
        self,
        covered: float,
        scores: CalibrationScores,
        *,
        max_step: int | None = None,
        max_delta: float | None = None,
        lower: float = 0.0,
        upper: float = 1.0,
    ) -> float:
        """One step of the level tracker (module docstring): u moves by the same rule as κ,
        kept in [``lower``, ``upper``] (levels), and κ = Q(u) of ``scores``.

        >>> cal = CalibrationScores.from_scores(np.linspace(0.05, 0.95, 19))
        >>> tr = OnlineThreshold(alpha=0.1, kappa=cal.kappa(0.1), eta0=0.5, level=0.1)
        >>> tr.update_level(0.0, cal, max_delta=0.05) < cal.kappa(0.1)
        True
        """
        level = self.position(scores)
        eta = self._eta(max_step, max_delta)
        self.level = online_threshold_update(level, covered, self.alpha, eta, lower, upper)
        self.kappa = scores.kappa(self.level)
        return self.kappa

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
