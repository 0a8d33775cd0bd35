"""What feedback does to the serve state: coverage counters and the online κ tracker (the
store that keeps them, for one process or many replicas, is :mod:`ccpo.runtime.state`).

Feedback on a served question is either its correct answer or "none of them". The question is
**covered** iff the correct answer is one of the returned answers under the task normaliser;
"none of them" is a miss. (Replay also counts unsolvable questions as covered; live, the rounds
that were not run are unknown, so a miss is a miss — the conservative reading.)

κ is updated with the *same* online tracker as training,
:class:`ccpo.learning.conformal.OnlineThreshold` (corrected sign: κ ← κ + η_k(covered − (1 − α)),
η_k = η_0 k^(−1/2−ξ)): a miss lowers κ, so the sets {π ≥ κ} grow; a run of covered questions
raises it. Under drift a step size that decays to zero stops tracking, so η_k stops decaying
after ``max_step`` feedbacks (η_k = η_0 · min(k, max_step)^(−1/2−ξ)); ``max_step=None`` gives
the training schedule exactly.

Feedback comes from clients, so κ must not follow whoever sends the most of it
(:class:`KappaBounds`): κ does not move before ``min_feedback`` feedbacks, moves by at most
``max_delta`` per feedback, and stays in a band ``[κ̂ − band, κ̂ + band]`` around the calibrated
κ̂ of the artifact that only the operator can widen (the config). Every move and every clamp is
counted (``kappa_moves``, ``kappa_clamped``) and the band is reported, in ``/metrics``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold

RECENT = 200  # feedbacks in the "recent coverage" window


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
        d = asdict(self)
        d["recent"] = list(self.recent)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Counters:
        d = dict(d)
        recent = deque(d.pop("recent", []), maxlen=RECENT)
        return cls(**d, recent=recent)


@dataclass(frozen=True)
class KappaBounds:
    """How far feedback may move κ: not before ``min_feedback`` feedbacks, at most
    ``max_delta`` per feedback, never outside [``lower``, ``upper``]."""

    lower: float = 0.0
    upper: float = 1.0
    max_delta: float = 1.0
    min_feedback: int = 0

    @classmethod
    def around(cls, kappa: float, band: float, max_delta: float, min_feedback: int) -> KappaBounds:
        """The band [κ̂ − band, κ̂ + band] ∩ [0, 1] around the calibrated κ̂."""
        return cls(max(0.0, kappa - band), min(1.0, kappa + band), max_delta, min_feedback)

    def clamp(self, old: float, new: float) -> float:
        """``new`` limited to one step from ``old`` and to the band."""
        step = min(max(new, old - self.max_delta), old + self.max_delta)
        return min(max(step, self.lower), self.upper)


def apply_feedback(
    tracker: OnlineThreshold,
    c: Counters,
    covered: bool,
    adapt: bool,
    max_step: int | None,
    bounds: KappaBounds,
) -> None:
    """One feedback: the coverage counters, and (if ``adapt``, after ``bounds.min_feedback``
    feedbacks) one step of κ ← κ + η_k(covered − (1 − α)) (paper Eq. 9, corrected sign) with
    η_k frozen after ``max_step`` steps, clamped by ``bounds``. Mutates ``tracker`` and ``c``."""
    c.feedback += 1
    c.covered += int(covered)
    c.recent.append(int(covered))
    if adapt and c.feedback > bounds.min_feedback:
        if max_step is not None:
            tracker.step = min(tracker.step, max_step - 1)
        old = tracker.kappa
        raw = tracker.update(float(covered))
        tracker.kappa = bounds.clamp(old, raw)
        c.kappa_clamped += int(tracker.kappa != raw)
        c.kappa_moves += int(tracker.kappa != old)
