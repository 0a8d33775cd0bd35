"""Baseline policies of the paper (§5 "Baselines"), scored by the same episode engine.

Every baseline here is a :class:`Row` of the evaluation harness: given episodes, evaluation
splits and α, return per-question :class:`~ccpo.traces.episodes.Metrics` of shape
[R, n_test]. Point policies return one answer; conformal policies return sets; ``oracle`` is a
bound, not a policy.

- ``random``: uniform over the allowed actions of each round.
- ``base`` / ``guide``: always the base (guide) answer at round 1.
- ``llm-policy:<model>``: the LLM-as-policy decisions stored in the traces' ``policy_llm``,
  with that LLM's own cost added to every round run.
- ``uala``: fixed thresholds on the guide's verdict and uncertainty (UALA, Han et al. 2024,
  with the guide's uncertainty as in the paper), chosen per split on the calibration questions
  to reach coverage ≥ 1−α at least cost.
- ``oracle``: the cost floor — knows which round first holds a correct answer and reaches
  exactly the 1−α coverage each test split needs as cheaply as possible. Not deployable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ccpo.errors import CCPOError
from ccpo.traces.episodes import BASE, GUIDE, NEXT, Episodes, Metrics, point_rollout


@dataclass(frozen=True)
class Splits:
    """One fixed training split and R random calibration/test splits of the held-out pool."""

    train: np.ndarray  # [n_train]
    cal: np.ndarray  # [R, n_cal]
    test: np.ndarray  # [R, n_test]

    @property
    def n_splits(self) -> int:
        return self.test.shape[0]


class Row(ABC):
    """A row the evaluation harness scores: a baseline, a rule or a trained policy. ``kind``
    is point, conformal, single, reference or bound."""

    name: str
    kind: str = "point"
    #: the calibration questions of each split (set by the harness before :meth:`fit`)
    calibration_size: int | None = None

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:  # noqa: B027
        """Train on the training split (no-op for fixed rules)."""

    @abstractmethod
    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        """Per-question metrics on every test split, arrays of shape [R, n_test]."""


class RandomPolicy(Row):
    """Uniform over the allowed actions (paper: "Random policy"); redrawn per split."""

    name = "random"

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        rng = np.random.default_rng([seed, 0xA11CE])
        R, n = splits.test.shape
        actions = rng.integers(0, 3, size=(R, n, ep.horizon))
        actions[..., -1] = rng.integers(0, 2, size=(R, n))
        return point_rollout(ep, actions, splits.test)


class FixedAnswerPolicy(Row):
    """Always return the base (or guide) answer of round 1."""

    def __init__(self, which: str) -> None:
        if which not in ("base", "guide"):
            raise ValueError(which)
        self.name = which
        self._action = BASE if which == "base" else GUIDE

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        actions = np.full((*splits.test.shape, ep.horizon), self._action)
        return point_rollout(ep, actions, splits.test)


class LLMPolicy(Row):
    """LLM-as-policy: decisions stored per round in the traces, paid for at every round run.

    A stored ``next`` at the last round (where it is not allowed) is read as the guide answer.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.name = f"llm-policy:{model}"

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        if self.model not in ep.llm_actions:
            have = ", ".join(sorted(ep.llm_actions)) or "none"
            raise CCPOError(
                f"the traces hold no LLM-as-policy decisions of '{self.model}' (they have: {have})"
            )
        acts = ep.llm_actions[self.model].astype(np.int64)
        if (acts < 0).any():
            i = int(np.argwhere(acts < 0)[0, 0])
            raise CCPOError(f"trace '{ep.ids[i]}' lacks a policy_llm decision of '{self.model}'")
        acts[:, -1] = np.where(acts[:, -1] == NEXT, GUIDE, acts[:, -1])
        return point_rollout(ep, acts[splits.test], splits.test, extra_cost=ep.llm_cost[self.model])


def uala_actions(
    verdict_yes: np.ndarray, uncertainty: np.ndarray, tau_base: np.ndarray, tau_guide: np.ndarray
) -> np.ndarray:
    """UALA's fixed-threshold rule, vectorised over threshold pairs.

    Round t < T: base answer if the guide said Yes and u ≤ τ_base; else guide answer if
    u ≤ τ_guide; else next round. Round T: base answer if Yes, else guide answer.
    A missing uncertainty counts as 0 (the rule then rests on the verdict); a missing verdict
    counts as No. ``verdict_yes``/``uncertainty`` [..., T]; ``tau_*`` [G] → actions [G, ..., T].
    """
    yes = np.nan_to_num(verdict_yes, nan=0.0) > 0.5
    u = np.nan_to_num(uncertainty, nan=0.0)
    tb = np.asarray(tau_base, dtype=float).reshape(-1, *([1] * u.ndim))
    tg = np.asarray(tau_guide, dtype=float).reshape(-1, *([1] * u.ndim))
    acts = np.where(yes & (u <= tb), BASE, np.where(u <= tg, GUIDE, NEXT))
    acts[..., -1] = np.where(yes[..., -1], BASE, GUIDE)
    return acts


class UALAPolicy(Row):
    """Thresholds (τ_base, τ_guide) on the guide's uncertainty, chosen per calibration split.

    Grid: −inf and the 0, 1/G, …, 1 quantiles of the calibration uncertainties. The pair
    reaching calibration coverage ≥ 1−α at least cost wins; when none reaches it, the pair
    with the highest coverage (then least cost). Fitted thresholds are kept in ``thresholds``.
    """

    name = "uala"

    def __init__(self, grid: int = 16) -> None:
        self.grid = grid
        self.thresholds: list[tuple[float, float]] = []

    def _choose(self, ep: Episodes, cal: np.ndarray, alpha: float) -> tuple[float, float]:
        u = ep.uncertainty[cal]
        finite = u[np.isfinite(u)]
        qs = np.quantile(finite, np.linspace(0, 1, self.grid + 1)) if finite.size else np.zeros(1)
        cand = np.unique(np.concatenate([[-np.inf], qs]))
        tb, tg = (g.ravel() for g in np.meshgrid(cand, cand, indexing="ij"))
        acts = uala_actions(ep.verdict_yes[cal], ep.uncertainty[cal], tb, tg)  # [G, n, T]
        idx = np.broadcast_to(cal, acts.shape[:-1])
        m = point_rollout(ep, acts, idx)
        cov, cost = m.covered.mean(-1), m.cost.sum(-1)
        ok = cov >= 1 - alpha
        if ok.any():  # least cost among the covering pairs (ties: higher coverage)
            best = np.lexsort((-cov, np.where(ok, cost, np.inf)))[0]
        else:  # highest coverage (ties: least cost)
            best = np.lexsort((cost, -cov))[0]
        return float(tb[best]), float(tg[best])

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        self.thresholds = [self._choose(ep, cal, alpha) for cal in splits.cal]
        tb = np.array([t[0] for t in self.thresholds])
        tg = np.array([t[1] for t in self.thresholds])
        acts = uala_actions(ep.verdict_yes[splits.test], ep.uncertainty[splits.test], tb, tg)
        # acts is [R(thresholds), R(splits), n, T]; keep each split's own thresholds
        acts = acts[np.arange(splits.n_splits), np.arange(splits.n_splits)]
        return point_rollout(ep, acts, splits.test)


def oracle_metrics(ep: Episodes, idx: np.ndarray, alpha: float) -> Metrics:
    """The cost floor on question sets ``idx`` [K, n] at coverage ≥ 1−α on each row.

    Per question the oracle stops at the first round holding a correct answer (cost of rounds
    1..t). Unsolvable questions are covered anyway and cost round 1. On each row it may leave
    ⌊α n⌋ solvable questions uncovered, answering them at round 1; it picks those that save the
    most. Set size is 1.
    """
    first = np.argmax(ep.correct.any(-1), axis=-1)  # [N], 0 when unsolvable
    cum = np.cumsum(ep.round_cost, axis=-1)
    full = cum[np.arange(ep.n), first]
    solv = ep.solvable
    cost, length = full[idx].copy(), first[idx] + 1
    covered = np.ones(idx.shape, dtype=bool)
    m = int(np.floor(alpha * idx.shape[-1]))
    if m > 0:
        saving = np.where(solv[idx], full[idx] - cum[idx, 0], -np.inf)
        drop = np.argsort(-saving, axis=-1, kind="stable")[..., :m]
        rows = np.arange(idx.shape[0])[:, None]
        dropped = np.isfinite(saving[rows, drop]) & (saving[rows, drop] > 0)
        cost[rows, drop] = np.where(dropped, cum[idx, 0][rows, drop], cost[rows, drop])
        length[rows, drop] = np.where(dropped, 1, length[rows, drop])
        covered[rows, drop] = ~dropped
    return Metrics(cost=cost, covered=covered, length=length, set_size=np.ones_like(length))


class OraclePolicy(Row):
    """The ``oracle`` row: a bound on what any policy could pay at coverage 1−α."""

    name = "oracle"
    kind = "bound"

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        return oracle_metrics(ep, splits.test, alpha)


BASELINES = ("random", "base", "guide", "uala", "oracle")


def make_baseline(name: str) -> Row:
    """A baseline by its results-file name (``llm-policy:<model>`` included)."""
    if name == "random":
        return RandomPolicy()
    if name in ("base", "guide"):
        return FixedAnswerPolicy(name)
    if name == "uala":
        return UALAPolicy()
    if name == "oracle":
        return OraclePolicy()
    if name.startswith("llm-policy:") and len(name) > len("llm-policy:"):
        return LLMPolicy(name.split(":", 1)[1])
    raise CCPOError(f"unknown policy '{name}'")
