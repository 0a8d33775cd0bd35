"""The one way to make a policy: :func:`train_policy` (a :class:`~ccpo.policies.spec.
PolicySpec` and traces → :class:`Trained`), used by ``ccpo train``, the Python API and the
evaluation harness alike.

It fits the spec's technique on the training questions (:data:`TECHNIQUES`, one module of
:mod:`ccpo.policies.techniques` each), puts it behind a router when the spec says so
(:func:`route_policy`), and, given calibration questions, calibrates it and sums up what
``train`` prints and writes (``summary.json``): calibration coverage and cost, the threshold,
the estimated latency held to the spec's budget, and what the technique adds (auto's choice,
the online κ, the router's τ̂). Nothing here reads a technique's own attributes: what differs
between techniques is a method of :class:`~ccpo.policies.base.Policy`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from ccpo.policies.base import Policy
from ccpo.policies.budget import check_budget
from ccpo.policies.routing.sets import route_set_policy
from ccpo.policies.routing.single import route
from ccpo.policies.single import SingleAnswerPolicy
from ccpo.policies.spec import PolicySpec
from ccpo.policies.techniques import auto, reference, rl, stopping
from ccpo.traces.episodes import Episodes
from ccpo.traces.latency import mean_latency

#: ``progress(step, entry)`` of an RL training run
Progress = Callable[[int, dict[str, float]], None]


class Technique(Protocol):
    """What every module of :mod:`ccpo.policies.techniques` provides."""

    NAMES: tuple[str, ...]

    def fit(
        self, spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
        progress: Progress | None = None,
    ) -> Policy: ...  # fmt: skip


_MODULES: tuple[ModuleType, ...] = (auto, stopping, rl, reference)
#: method name → its technique
TECHNIQUES: dict[str, Technique] = {n: m for m in _MODULES for n in m.NAMES}  # type: ignore[misc]


@dataclass
class Trained:
    """A fitted policy (calibrated when calibration questions were given), what ``train``
    writes to ``summary.json`` and the lines it says besides (``notes``)."""

    policy: Policy
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def route_policy(
    pol: Policy, spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, seed: int
) -> Policy:
    """``pol`` behind a router fitted on the same questions (a single answer:
    :mod:`~ccpo.policies.routing.single`; a CStop set: :mod:`~ccpo.policies.routing.sets`); a
    policy with no rung to skip (one model alone, a fixed rule, CCPO) is returned as it is."""
    if spec.single:
        if not isinstance(pol, SingleAnswerPolicy):
            return pol
        return route(pol, ep, train_idx, seed, embedded=spec.route_embeddings)
    return route_set_policy(pol, ep, train_idx, seed)


def train_policy(
    spec: PolicySpec,
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    *,
    cal: np.ndarray | None = None,
    prices: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> Trained:
    """Fit ``spec`` on ``train_idx`` of ``ep`` at α and ``seed``; with ``cal``, calibrate it
    there and sum it up (module docstring), refusing (:class:`~ccpo.policies.budget.
    OverBudget`) a calibrated policy over ``spec.latency_budget``. ``prices``: the price file
    it records; ``provenance``: what it was trained on; ``progress``: RL training steps."""
    t0 = time.perf_counter()
    if cal is not None:
        spec = replace(spec, calibration_size=int(np.asarray(cal).size))
    pol = TECHNIQUES[spec.method].fit(spec, ep, np.asarray(train_idx), alpha, seed, progress)
    notes = []
    if spec.route:
        routed = route_policy(pol, spec, ep, train_idx, seed)
        if routed is pol and not spec.single:
            notes.append(f"{pol.variant} is not routed (set routing applies to cstop and cstop-lr)")
        pol = routed
    pol.feature_spec = ep.feature_spec  # the observations it was fitted on (ladder signals)
    if prices is not None:
        pol.prices = prices
    if provenance is not None:
        pol.provenance = provenance
    summary: dict[str, Any] = {
        "method": spec.method,
        "variant": pol.variant,
        **({"answer": "single"} if spec.single else {}),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if cal is not None:
        summary.update(_calibration(pol, ep, np.asarray(cal), len(train_idx)))
        check_budget(summary["calibration_latency_s"], spec.latency_budget, pol.variant,
                     "auto" in summary)  # fmt: skip
    return Trained(pol, summary, notes)


def _calibration(pol: Policy, ep: Episodes, cal: np.ndarray, n_train: int) -> dict[str, Any]:
    """Calibrate ``pol`` on the questions ``cal`` and its figures there (summary.json)."""
    cal_ep = ep.subset(cal)
    got = pol.calibrate(cal_ep) if pol.calibrates else None
    threshold = pol.threshold
    scores = pol.episode_scores(cal_ep)
    m = pol.rollout(cal_ep, scores, threshold)
    out: dict[str, Any] = (
        {"threshold": threshold, "delta": pol.delta,
         "calibration_misses": None if got is None else got.misses,
         **({"guarantee": "marginal"} if getattr(pol, "marginal", False) else {})}
        if pol.single else {"kappa": threshold}
    )  # fmt: skip
    out.update(
        calibration_coverage=float(m.covered.mean()),
        calibration_cost_cents=float(m.cost.sum() * 100),
    )
    if pol.single:
        out["calibration_rounds"] = float(m.length.mean())
    else:
        out["calibration_full_set_rate"] = pol.full_set_rate(cal_ep, scores, threshold)
    out["sizes"] = {"train": int(n_train), "calibration": int(cal.size)}
    out.update(**pol.info, **pol.summary_fields())
    out["calibration_latency_s"] = mean_latency(cal_ep.round_latency, None, m)
    budget = pol.provenance.get("latency_budget_s")
    return out if budget is None else {**out, "latency_budget_s": budget}
