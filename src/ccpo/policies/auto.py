"""``auto``: pick the technique of least validation cost by K-fold cross-fitting.

Each candidate is a *fitter*, (episodes, question indices, α, seed) → a policy. Every
candidate is fitted K times on K − 1 folds of the training questions and scores the held-out
fold; the out-of-fold scores are then scored as the harness would (a *validator*: calibrated
on random halves, measured on the others). Ties go to the earlier candidate. Only training
questions are used, so the calibration split never sees the choice and the guarantee of the
calibrated winner is untouched (docs/theory.md, "auto: cross-fitting keeps the guarantee").
With a latency budget only candidates whose validation latency is within it are eligible
(:mod:`ccpo.policies.budget`).

Main names: :func:`cross_fit`, :class:`Selection`. Which candidates exist and how each is
fitted is :mod:`ccpo.policies.registry`'s business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.policies.base import Policy
from ccpo.policies.budget import COST, LATENCY, pick
from ccpo.traces.episodes import Episodes

Fitter = Callable[[Episodes, np.ndarray, float, int], Policy]
#: (episodes of the training questions, their out-of-fold scores) → (USD/question, coverage)
#: or (USD/question, coverage, estimated seconds/question)
Validator = Callable[[Episodes, np.ndarray], tuple[float, ...]]
#: a candidate with nothing to fit (``always-<reference>``): its figures on the training
#: questions directly, as a validator's; cost +inf when it is not eligible
Direct = Callable[[Episodes], tuple[float, ...]]


@dataclass(frozen=True)
class Selection:
    """What ``auto`` chose and the validation figures behind the choice."""

    method: str
    figures: dict[str, dict[str, float]]  # candidate → validation cost (cents/question), cov, s
    folds: int
    latency_budget: float | None = None  # seconds per question; None: no budget

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"picked": self.method, "folds": self.folds}
        if self.latency_budget is not None:
            out["latency_budget_s"] = self.latency_budget
        return {**out, "validation": self.figures}


def as_figures(got: tuple[float, ...]) -> dict[str, float]:
    """A validator's tuple as the figures of one candidate (latency when it gives one)."""
    out = {COST: got[0] * 100, "coverage": got[1]}
    return {**out, LATENCY: got[2]} if len(got) > 2 else out


def fold_count(n: int, folds: int) -> int:
    """K: ``folds``, at most one fold per 10 questions, at least 2; 1 below 20 questions."""
    return max(2, min(folds, n // 10)) if n >= 20 else 1


def cross_fit(
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    fitters: Mapping[str, Fitter],
    validate: Validator,
    seed: int = 0,
    folds: int = 5,
    salt: int = 0xA070,
    direct: Mapping[str, Direct] | None = None,
    latency_budget: float | None = None,
) -> Selection:
    """The candidate of ``fitters`` (then of ``direct``, scored on all of ``train_idx``) of
    least validation cost on ``train_idx`` (module docstring): a ``direct`` candidate wins
    only when strictly cheaper; ``salt`` seeds the fold split apart from other uses of
    ``seed``. ``latency_budget``: only candidates within it are eligible
    (:func:`ccpo.policies.budget.pick`, which raises when none is)."""
    idx = np.asarray(train_idx)
    if len(fitters) == 0:
        raise CCPOError("auto needs at least one candidate method")
    k = fold_count(idx.size, folds)
    perm = np.random.default_rng([seed, salt]).permutation(idx)
    parts = np.array_split(perm, k) if k > 1 else [perm]
    sub = ep.subset(perm)
    figures: dict[str, dict[str, float]] = {}
    for name, fit in fitters.items():
        scores: np.ndarray | None = None
        start = 0
        for i, held in enumerate(parts):
            rest = np.concatenate([p for j, p in enumerate(parts) if j != i]) if k > 1 else held
            got = fit(ep, rest, alpha, seed).scores(ep.obs[held])
            if scores is None:
                scores = np.zeros((perm.size, *got.shape[1:]))
            scores[start : start + held.size] = got
            start += held.size
        assert scores is not None
        figures[name] = as_figures(validate(sub, scores))
    for name, figures_of in (direct or {}).items():
        figures[name] = as_figures(figures_of(sub))
    return Selection(pick(figures, latency_budget), figures, k, latency_budget)
