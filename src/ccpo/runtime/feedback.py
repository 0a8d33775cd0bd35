"""What feedback does to the serve state: coverage counters and the online κ tracker (the
store that keeps them, for one process or many replicas, is :mod:`ccpo.runtime.state`).

- :func:`apply_feedback`: a served question's feedback is its correct answer, "none of them"
  (a miss) or "unanswerable" (covered, as calibration counts an unsolvable question); it
  updates :class:`Counters` and, with online κ, takes one step of the training's own tracker.
- :func:`online_kappa`: that tracker (:class:`ccpo.learning.conformal.OnlineThreshold`), on the
  calibration level u (κ = Q(u)) when the policy keeps its calibration scores, else on κ.
- :class:`KappaBounds`: feedback comes from clients, so κ does not move before
  ``min_feedback`` feedbacks, η (never the step) is bounded by ``max_delta``, and κ stays in
  a band around κ̂ that only the operator widens. Moves and clamps are counted for /metrics.
- :func:`drift` (:class:`Drift`): the coverage of the last :data:`RECENT` feedbacks against
  1 − α, judged once :data:`DRIFT_MIN` are in.

Derivation: docs/theory.md, section "Online κ (ACI)"; the API: docs/deploy.md ("Feedback and
κ", under "`ccpo serve`").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

from ccpo.errors import CCPOError
from ccpo.learning.conformal import (
    CalibrationScores,
    OnlineThreshold,
    bounded_step_size,
    short_beyond_noise,
)
from ccpo.runtime.config import ServerConfig

RECENT = 200  # feedbacks in the "recent coverage" window
DRIFT_MIN = 50  # feedbacks in the window before drift is judged (a test after every feedback)


class FeedbackError(CCPOError):
    """Feedback that cannot be applied (unknown id, already given); carries an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass
class Counters:
    requests: int = 0  # answered questions
    errors: int = 0  # questions that failed (upstream, budget)
    rejected: int = 0  # requests refused before any LLM call (validation, auth, rate, budget)
    cost_usd: float = 0.0  # Σ cost_usd of answered questions (usage × price)
    spent_usd: float = 0.0  # dollars actually paid to the endpoints (cache hits free)
    set_size_sum: int = 0
    rounds_sum: int = 0
    feedback: int = 0
    covered: int = 0
    kappa_moves: int = 0  # feedbacks that moved κ
    kappa_clamped: int = 0  # κ steps cut short by max_delta or the band
    inflight_usd: float = 0.0  # counted as spent if its replica dies (wallets, calls' worst)
    reserved_usd: float = 0.0  # all reservations: calls in flight and questions admitted
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT))

    def to_json(self) -> dict[str, Any]:
        """The counters as JSON values (shallow: every field is a number but ``recent``;
        ``dataclasses.asdict`` deep-copies, a fifth of a state transaction's Python)."""
        d = {f: getattr(self, f) for f in _COUNTER_FIELDS}
        d["recent"] = list(self.recent)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Counters:
        d = dict(d)
        recent = deque(d.pop("recent", []), maxlen=RECENT)
        return cls(**d, recent=recent)


_COUNTER_FIELDS = tuple(f.name for f in fields(Counters))


@dataclass(frozen=True)
class KappaBounds:
    """How far feedback may move κ: not before ``min_feedback`` feedbacks, at most
    ``max_delta`` per feedback, never outside [``lower``, ``upper``]. With calibration
    ``scores`` the tracker moves the level u (κ = Q(u),
    :class:`ccpo.learning.conformal.CalibrationScores`) and ``lower``/``upper`` are levels."""

    lower: float = 0.0
    upper: float = 1.0
    max_delta: float = 1.0
    min_feedback: int = 0
    scores: CalibrationScores | None = None

    @classmethod
    def around(
        cls,
        kappa: float,
        alpha: float,
        band: float,
        max_delta: float,
        min_feedback: int,
        scores: CalibrationScores | None = None,
    ) -> KappaBounds:
        """The band around the calibrated κ̂: levels [α − band, α + band] with calibration
        ``scores`` (not cut to [0, 1]: Q is 0 below level 0 and 1 above 1, and a level below 0
        keeps the misses it still owes, which the telescoping coverage bound counts; Gibbs &
        Candès let α_t leave [0, 1] alike), else [κ̂ − band, κ̂ + band] ∩ [0, 1]."""
        if scores is not None:
            return cls(alpha - band, alpha + band, max_delta, min_feedback, scores)
        return cls(max(0.0, kappa - band), min(1.0, kappa + band), max_delta, min_feedback)

    @property
    def kappa_range(self) -> tuple[float, float]:
        """The band in κ units (what /metrics reports)."""
        if self.scores is None:
            return self.lower, self.upper
        return self.scores.kappa(self.lower), self.scores.kappa(self.upper)

    def clamp(self, tracker: OnlineThreshold) -> None:
        """Bring a restored tracker into the band (an operator narrowed it)."""
        kept = min(max(tracker.position(self.scores), self.lower), self.upper)
        if self.scores is None:
            tracker.kappa = kept
        else:
            tracker.level, tracker.kappa = kept, self.scores.kappa(kept)

    def eta_max(self, alpha: float) -> float:
        """The largest η that keeps every step within ``max_delta``."""
        return bounded_step_size(math.inf, alpha, self.max_delta)


def online_kappa(
    kappa: float | None,
    alpha: float,
    train_eta0: float,
    xi: float,
    cfg: ServerConfig,
    scores: CalibrationScores | None = None,
) -> tuple[OnlineThreshold, KappaBounds]:
    """The online κ tracker and its bounds for a policy of calibrated ``kappa`` (None: a point
    policy) under the server settings ``cfg``: η_0 = ``cfg.kappa_eta0``, else the training η_0
    per question (``train_eta0``), the band, the per-feedback bound and warm-up. With the
    artifact's calibration ``scores`` the tracker moves the level (starting at α, where
    Q(α) = κ̂); without, κ itself."""
    k = kappa if kappa is not None else 0.0
    tracker = OnlineThreshold(
        alpha=alpha,
        kappa=k,
        eta0=cfg.kappa_eta0 or train_eta0,
        xi=xi,
        level=None if scores is None else alpha,
    )
    bounds = KappaBounds.around(
        k, alpha, cfg.kappa_band, cfg.kappa_max_delta, cfg.kappa_min_feedback, scores
    )
    return tracker, bounds


def apply_feedback(
    tracker: OnlineThreshold,
    c: Counters,
    covered: bool,
    adapt: bool,
    max_step: int | None,
    bounds: KappaBounds,
) -> None:
    """One feedback: the coverage counters, and (if ``adapt``, after ``bounds.min_feedback``
    feedbacks) one step of u (or κ) ← · + η_k(covered − (1 − α)) (paper Eq. 9, corrected
    sign) with η_k frozen after ``max_step`` steps and bounded by ``bounds.max_delta`` (a
    bound on η, so the fixed point stays at coverage 1 − α), kept in the band. Mutates
    ``tracker`` and ``c``."""
    c.feedback += 1
    c.covered += int(covered)
    c.recent.append(int(covered))
    if adapt and c.feedback > bounds.min_feedback:
        old, eta = tracker.kappa, tracker.eta(max_step)
        cut = eta > bounds.eta_max(tracker.alpha)
        free = tracker.position(bounds.scores) + eta * (float(covered) - (1.0 - tracker.alpha))
        box = dict(max_step=max_step, max_delta=bounds.max_delta, lower=bounds.lower,
                   upper=bounds.upper)  # fmt: skip
        if bounds.scores is None:
            tracker.update(float(covered), **box)
        else:
            tracker.update_level(float(covered), bounds.scores, **box)
        c.kappa_clamped += int(cut or not bounds.lower <= free <= bounds.upper)
        c.kappa_moves += int(tracker.kappa != old)


@dataclass(frozen=True)
class Drift:
    """The coverage of the last feedbacks against the target 1 − α."""

    coverage: float | None  # covered share of the recent window (None: no feedback yet)
    n: int  # feedbacks in the window
    target: float  # 1 − α
    short: bool  # below the target beyond noise (Clopper-Pearson 95% upper bound < 1 − α)
    # judged once the window holds DRIFT_MIN feedbacks: the test runs after every feedback,
    # and a window of a few misses would raise the alarm on noise at a tiny α


def drift(c: Counters, alpha: float) -> Drift:
    """Rolling coverage of the last :data:`RECENT` feedbacks and whether it is short of 1 − α
    beyond noise (:func:`ccpo.learning.conformal.short_beyond_noise`, once the window holds
    :data:`DRIFT_MIN`)."""
    n, k = len(c.recent), sum(c.recent)
    short = n >= DRIFT_MIN and short_beyond_noise(k, n, alpha)
    return Drift(k / n if n else None, n, 1.0 - alpha, short)
