"""``always-<reference>``: call the reference model alone and return its answer.

The yardstick of every saving, and a candidate of ``auto`` (sets and single answers), so that
a policy never ships dearer than calling the reference alone. It pays one call per question:
the reference's ``agree`` step (:attr:`~ccpo.traces.episodes.Episodes.strongest_step`, the
model answering the question itself), never the rungs below it.

- Labels from a reference model: its answer agrees with itself, so agreement is 1 by
  construction and the guarantee holds at any α.
- Gold labels (``always-<strongest>``): its accuracy is what it is. Calibration tests
  P(wrong and answerable) ≤ α by the exact binomial test at δ (Learn-then-Test with the one
  hypothesis; docs/theory.md, "Learn-then-Test (single answer)"), or, for a single answer
  under the marginal guarantee (``config.guarantee``, as its peers), by (k + 1)/(n + 1) ≤ α
  (:mod:`ccpo.policies.risk_control` with one threshold), and refuses when it fails.

Main names: :class:`ReferencePolicy`, :func:`reference_validator`. Contract: docs/design.md,
"The policy interface".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import StopConfig
from ccpo.policies.base import Answered, AnswerKind, Calibration, Policy, RoundDecision
from ccpo.policies.folder import read_side_files, shared_fields, write_folder
from ccpo.policies.risk_control import MARGINAL, PAC, certified
from ccpo.policies.single import DELTA, Unreachable, reachable_alpha
from ccpo.traces.episodes import Episodes, Metrics, step_mask
from ccpo.traces.featurize import FEATURE_SPEC
from ccpo.traces.labels import GOLD, reference_model
from ccpo.traces.schema import ACTIONS

#: the ``method`` of its folder and the prefix of its variant (``always-gpt-4o``)
METHOD = "always"


def reference_name(model: str) -> str:
    """The candidate / row / variant name: ``always-<model>``."""
    return f"{METHOD}-{model}"


def _misses(ep: Episodes, idx: np.ndarray | None = None) -> np.ndarray:
    """[...] bool: the model's answer is wrong on a question some round answers correctly."""
    assert ep.strongest_correct is not None
    sel = (lambda a: a) if idx is None else (lambda a: a[idx])
    return ~sel(ep.strongest_correct) & sel(ep.solvable)


def callable_alone(ep: Episodes) -> bool:
    """These traces price calling their strongest (or reference) model alone faithfully."""
    return bool(ep.strongest) and ep.strongest_step is not None and ep.strongest_cost is not None


@dataclass
class ReferencePolicy(Policy):
    """Call ``model`` alone (the ``agree`` step ``step`` of the ladder) and return its
    answer; ``kind``: the answer kind of the ``auto`` it stands in for (a set of one answer,
    or a single answer)."""

    model: str
    step: tuple[int, str]
    horizon: int
    config: StopConfig
    kind: AnswerKind = "single"
    delta: float = DELTA
    misses: tuple[int, int] | None = None  # (misses, n) at calibration; None: not calibrated
    labels: str = GOLD  # what correct means in the traces it was fitted on
    variant: str = ""
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    prices: dict[str, Any] | None = None
    log: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.variant = self.variant or reference_name(self.model)
        self.step = (int(self.step[0]), str(self.step[1]))

    @property
    def answer(self) -> AnswerKind:  # type: ignore[override]
        return self.kind

    @property
    def method(self) -> str:
        return METHOD

    @property
    def alpha(self) -> float:
        return self.config.alpha

    def start_rung(self, question: str, embedding: Sequence[float] | None = None) -> int:
        """Its step's round, before any call: the rounds before it are skipped."""
        return self.step[0] - 1

    def decided_step(self, horizon: int) -> tuple[int, str] | None:
        """Its one step: returned whatever happens, so streamed as it is written."""
        return self.step

    def round_roles(self, t: int) -> tuple[str, ...]:
        """Its one step in its round (the agent stops there: :meth:`decide`)."""
        return (self.step[1],) if t == self.step[0] else ()

    @property
    def threshold(self) -> float:
        """No threshold to speak of: 1.0 once calibrated (the one rule there is)."""
        if self.misses is None:
            raise CCPOError(f"the {self.variant} policy is not calibrated yet")
        return 1.0

    @property
    def threshold_name(self) -> str:
        return ""

    def threshold_text(self, how: str = "") -> str:
        return f"no threshold: {self.model} answers alone"

    def full_set_rate(self, ep: Episodes, scores: Any, threshold: float | None) -> float:
        return 0.0  # one answer of one call

    def set_threshold(self, value: float) -> None:
        """Nothing to set: it calls one model whatever the threshold."""

    @property
    def is_calibrated(self) -> bool:
        return self.misses is not None

    @property
    def marginal(self) -> bool:
        """A single answer under the marginal guarantee (``config.guarantee``): calibrated by
        (k + 1)/(n + 1) ≤ α, as the single-answer policies it stands beside."""
        return self.kind == "single" and self.config.guarantee == MARGINAL

    @property
    def level(self) -> float | None:
        """What the calibration tests at: δ, or None for the marginal guarantee."""
        return None if self.marginal else self.delta

    def _by_reference(self) -> bool:
        return reference_model(self.provenance.get("against") or self.labels) == self.model

    def guarantee_statement(self) -> str:
        m = self.model
        if self._by_reference():
            return (
                f"the answer is {m}'s own, {m} called alone: agreement with {m} is 1 by "
                f"construction (target ≥ {round(1.0 - self.alpha, 12):g})"
            )
        k, n = self.misses or (0, 0)
        how = (
            "on average over the calibration draw"
            if self.marginal
            else f"with probability ≥ {1 - self.delta:g} over the calibration questions"
        )
        return (
            f"the answer is {m}'s, {m} called alone: P(wrong on a question some round can "
            f"answer) ≤ {self.alpha:g} {how} ({k} such misses in {n})"
        )

    # ------------------------------------------------------------------ replay
    def _check(self, ep: Episodes) -> None:
        if ep.strongest != self.model or ep.strongest_cost is None:
            raise CCPOError(
                f"{self.variant}: these traces do not call {self.model} alone in every "
                f"question (their yardstick is {ep.strongest or 'no one model'})"
            )

    def scores(self, obs: np.ndarray) -> np.ndarray:
        lead = np.asarray(obs).shape[:-1]
        return np.zeros((*lead, 3)) if self.kind == "set" else np.ones(lead)

    def _test(self, ep: Episodes, idx: np.ndarray, alpha: float) -> tuple[int, int, bool]:
        """(misses, n, certified) on the questions ``idx``; reference labels always pass."""
        k, n = int(_misses(ep, idx).sum()), int(np.asarray(idx).size)
        ok = ep.labels != GOLD or certified(k, n, alpha, self.level)
        return k, n, ok

    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        """Test the one rule on the calibration questions (module docstring); raises
        :class:`~ccpo.policies.single.Unreachable` when gold labels do not certify α."""
        self._check(ep)
        idx = np.arange(ep.n) if cal is None else np.asarray(cal)
        k, n, ok = self._test(ep, idx, self.alpha)
        if not ok:
            reach = (
                f"{(k + 1) / (n + 1):.3f} (marginal)"
                if self.marginal
                else f"{reachable_alpha(k, n, self.delta):.3f} at δ = {self.delta:g}"
            )
            raise Unreachable(
                f"{self.variant}: {k} wrong answers on {n} calibration questions certify only "
                f"α ≥ {reach}; use a larger --alpha"
            )
        self.misses = (k, n)
        return Calibration(1.0, k, n, 1)

    def split_thresholds(
        self, ep: Episodes, scores: np.ndarray, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        self._check(ep)
        refused = np.array([not self._test(ep, c, alpha)[2] for c in cal], dtype=bool)
        return np.ones(len(cal)), refused

    def rollout(
        self, ep: Episodes, scores: np.ndarray, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        self._check(ep)
        assert ep.strongest_cost is not None
        cost = ep.strongest_cost if idx is None else ep.strongest_cost[idx]
        ones = np.ones(cost.shape, dtype=np.int64)
        lat = ep.strongest_latency
        lat = None if lat is None else (lat if idx is None else lat[idx])
        step = step_mask(self.step, cost.shape, ep.horizon)  # its one call, run and returned
        return Metrics(cost, ~_misses(ep, idx), ones, ones, lat, called=step, returned=step)

    def replay_answers(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray]:
        """Round t of its step is the one "run", its role's answer the one returned."""
        self._check(ep)
        t, role = self.step
        reach = np.zeros((ep.n, ep.horizon), dtype=bool)
        reach[:, t - 1] = True
        included = np.zeros((ep.n, ep.horizon, 2), dtype=bool)
        included[:, t - 1, ACTIONS.index(role)] = True
        return reach, included

    def round_costs(self, ep: Episodes) -> np.ndarray:
        """Its one call's cost in its step's round, nothing in the other rounds."""
        self._check(ep)
        assert ep.strongest_cost is not None
        costs = np.zeros((ep.n, ep.horizon))
        costs[:, self.step[0] - 1] = ep.strongest_cost
        return costs

    # ------------------------------------------------------------------ live
    def decide(
        self, obs: np.ndarray, t: int, threshold: float | None, answered: Answered
    ) -> RoundDecision:
        """Its one step's answer, returned in the round it starts at (:meth:`start_rung`), where
        it calls that step alone (:meth:`round_roles`)."""
        a = ACTIONS.index(self.step[1])
        p = np.zeros(3)
        p[a] = 1.0
        return RoundDecision(p, (ACTIONS[a],), fallback=False, go_on=False)

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        meta = {
            **self.folder_header(),
            "model": self.model,
            "step": list(self.step),
            "delta": self.delta,
            "labels": self.labels,
            "calibration_misses": None if self.misses is None else list(self.misses),
        }
        return write_folder(folder, meta, self.feature_spec, self.prices, self.log)

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> ReferencePolicy:
        misses = meta.get("calibration_misses")
        return cls(
            model=meta["model"],
            step=tuple(meta["step"]),  # type: ignore[arg-type]
            horizon=int(meta["horizon"]),
            # folders made before the marginal guarantee were certified at δ
            config=StopConfig(**{"guarantee": PAC, **meta["config"]}),
            kind=meta.get("answer", "single"),
            delta=float(meta.get("delta", DELTA)),
            misses=None if misses is None else (int(misses[0]), int(misses[1])),
            labels=meta.get("labels", GOLD),
            variant=meta.get("variant", ""),
            **shared_fields(meta, read_side_files(folder)),
        )

    @classmethod
    def fit(
        cls, ep: Episodes, kind: AnswerKind, cfg: StopConfig, delta: float = DELTA
    ) -> ReferencePolicy:
        """The policy for the traces' yardstick model (nothing to learn)."""
        if not callable_alone(ep):
            raise CCPOError(
                "these traces cannot price calling one model alone (no agree step of the "
                "strongest or reference model in every question)"
            )
        assert ep.strongest_step is not None
        return cls(ep.strongest, ep.strongest_step, ep.horizon, cfg, kind, delta, labels=ep.labels)


def reference_validator(
    alpha: float, delta: float | None = DELTA, like: int | None = None
) -> Callable[[Episodes], tuple[float, float]]:
    """``auto``'s figures of the candidate on the training questions ``sub``: (mean cost USD,
    coverage), cost +inf when gold labels do not certify α there (not eligible); ``like``:
    tested at the miss rate the test allows on that many calibration questions, as its
    peers are validated."""

    def validate(sub: Episodes) -> tuple[float, float]:
        assert sub.strongest_cost is not None
        k = int(_misses(sub).sum())
        cov = 1.0 - k / max(sub.n, 1)
        if sub.labels == GOLD and not certified(k, sub.n, alpha, delta, like):
            return float("inf"), cov
        return float(sub.strongest_cost.mean()), cov

    return validate
