"""CStop — conformal stopping learnt on replayed traces: the method beyond the paper.

After round t every answer of rounds 1..t is in the set, and the agent goes on iff its
continuation score g_t ≥ κ, where g_t = P̂(no answer so far is correct, and a later one is |
o_1..o_t) (the question is "fixable") is a classifier fitted on the training questions
(:mod:`ccpo.policies.classifier`). As membership scores e = (1, 1, g_t) this is a conformal
set policy, so split-conformal κ̂ gives P(covered) ≥ 1 − α for *any* classifier: a poor one
costs money, never coverage (docs/theory.md, "CStop").

Main names: :class:`StoppingPolicy` (the policy), :func:`fit_stopping`, :func:`fixable_labels`,
:func:`membership_scores`. The fixed rules in the same family are :mod:`ccpo.policies.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import Learner, StopConfig
from ccpo.learning.conformal import CalibrationScores
from ccpo.policies.classifier import (
    fit_classifier,
    round_scores,
    training_questions,
    training_rows,
)
from ccpo.policies.folder import load_classifier, save_classifier, shared_fields
from ccpo.policies.sets import SetPolicy
from ccpo.traces.episodes import NEXT, Episodes
from ccpo.traces.featurize import FEATURE_SPEC

#: method name → learner of the stopping classifier
STOPPING_METHODS: dict[str, Learner] = {"cstop": "hgb", "cstop-lr": "logistic"}


def fixable_labels(correct: np.ndarray, solvable: np.ndarray) -> np.ndarray:
    """[n, T] bool: no answer of rounds 1..t is correct, but one of a later round is.

    ``correct`` [n, T, 2], ``solvable`` [n]. This is the event that going on can still fix
    the question; it is False at t = T.
    """
    hit = np.asarray(correct).any(-1)
    so_far = np.logical_or.accumulate(hit, axis=-1)
    return ~so_far & np.asarray(solvable)[:, None]


def membership_scores(g: np.ndarray) -> np.ndarray:
    """[..., T, 3] membership scores (1, 1, g_t): C_κ = {base, guide} ∪ {next iff g_t ≥ κ}."""
    g = np.clip(np.asarray(g, dtype=np.float64), 0.0, 1.0)
    out = np.ones((*g.shape, 3))
    out[..., NEXT] = g
    out[..., -1, NEXT] = 0.0  # masked at T anyway
    return out


@dataclass
class StoppingPolicy(SetPolicy):
    """The CStop policy: the fitted classifier, T, κ̂ and provenance."""

    model: Any  # a fitted scikit-learn classifier, a float (constant score), None (a rule)
    horizon: int
    config: StopConfig
    variant: str = "cstop"
    kappa_batch: float | None = None
    calibration: CalibrationScores | None = None  # κ̂'s scores (online level tracker)
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    prices: dict[str, Any] | None = None
    log: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # e.g. the choice made by auto
    provenance: dict[str, Any] = field(default_factory=dict)  # ccpo.policies.provenance

    @property
    def method(self) -> str:
        return self.variant

    @property
    def kappa(self) -> float:
        if self.kappa_batch is None:
            raise CCPOError(f"the {self.variant} policy is not calibrated yet (no κ̂)")
        return self.kappa_batch

    def continuation(self, obs: np.ndarray) -> np.ndarray:
        """g_t for observations [..., T, F] (0 at round T)."""
        obs = np.asarray(obs)
        if obs.ndim < 2 or obs.shape[-2] != self.horizon:
            raise ValueError(f"obs must have shape [..., {self.horizon}, F], got {obs.shape}")
        return self._continuation(obs)

    def _continuation(self, obs: np.ndarray) -> np.ndarray:
        out = np.zeros(obs.shape[:-1])
        out[..., :-1] = round_scores(self.model, obs)
        return out

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """Membership scores [..., T, 3] = (1, 1, g_t) (see the module docstring)."""
        return membership_scores(self.continuation(obs))

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        meta = {
            **self.folder_header(),
            "kappa_online": None,
            "kappa_batch": self.kappa_batch,
            **({"calibration_scores": self.calibration.to_json()} if self.calibration else {}),
        }
        side = (self.feature_spec, self.prices, self.log)
        return save_classifier(folder, meta, side, self.model)

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> StoppingPolicy:
        """Load a folder whose ``policy.json`` (already parsed: ``meta``) names CStop or a rule.

        The classifier is a pickle made by this ccpo (only load folders you trust, as with
        any model file); a different scikit-learn version is refused rather than risk
        silently different scores.
        """
        model, side = load_classifier(folder, meta, f"ccpo train --method {meta['method']}")
        return cls(
            model=model,
            horizon=int(meta["horizon"]),
            config=StopConfig(**meta["config"]),
            variant=meta.get("variant", meta["method"]),
            kappa_batch=meta.get("kappa_batch"),
            calibration=CalibrationScores.from_json(meta.get("calibration_scores")),
            **shared_fields(meta, side),
        )


def fit_stopping(
    ep: Episodes, train_idx: np.ndarray, cfg: StopConfig, variant: str = "cstop"
) -> StoppingPolicy:
    """Fit the continuation classifier on the questions ``train_idx`` (rows t < T).

    With a single class in the labels (tiny data) the score is that constant: still a valid
    conformal policy (κ̂ then runs every question to the same depth).
    """
    idx, T = training_questions(ep, train_idx, "a stopping policy")
    y = fixable_labels(ep.correct[idx], ep.solvable[idx])[:, :-1].reshape(-1)
    model = fit_classifier(training_rows(ep.obs[idx]), y, cfg)
    pol = StoppingPolicy(model=model, horizon=T, config=cfg, variant=variant)
    pol.log.append({"fit/rows": float(y.size), "fit/fixable_rate": float(y.mean())})
    return pol
