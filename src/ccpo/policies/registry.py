"""The registry: every technique by name, and a policy folder back to its class.

The names (:data:`METHODS`, their grammar) are :mod:`ccpo.policies.spec`'s; the techniques
are the modules of :mod:`ccpo.policies.techniques`; making a policy is
:func:`ccpo.policies.pipeline.train_policy`'s. This module loads folders
(:func:`load_policy`) and keeps the shortcut scripts call by method name
(:func:`fit_policy`: a spec handed to the pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.learning.config import TrainConfig
from ccpo.policies.base import Policy
from ccpo.policies.cstop import STOPPING_METHODS, StoppingPolicy
from ccpo.policies.folder import read_meta
from ccpo.policies.pipeline import train_policy
from ccpo.policies.reference import METHOD as REFERENCE_METHOD
from ccpo.policies.reference import ReferencePolicy
from ccpo.policies.rl import RLPolicy
from ccpo.policies.routing.sets import RoutedSetPolicy
from ccpo.policies.routing.single import RoutedPolicy
from ccpo.policies.rules import FIXED_RULES, RulePolicy
from ccpo.policies.single import DELTA, SINGLE_METHODS, SingleAnswerPolicy
from ccpo.policies.spec import (
    METHODS,
    MethodSpec,
    PolicySpec,
    compare_rows,
    method_help,
    method_names,
    parse_spec,
    resolve_method,
    single_form_of,
    variant_name,
)
from ccpo.policies.techniques.auto import (
    AUTO_CANDIDATES,
    RL_CANDIDATES,
    candidate_fitter,
    fit_auto,
    select_method,
)
from ccpo.policies.techniques.reference import reference_candidate
from ccpo.policies.techniques.rl import AUTO_RL_STEPS, rl_fitter
from ccpo.policies.techniques.stopping import SCORE_METHODS, stopping_fitter
from ccpo.traces.episodes import Episodes

__all__ = [
    "AUTO_CANDIDATES",
    "AUTO_RL_STEPS",
    "METHODS",
    "RL_CANDIDATES",
    "SCORE_METHODS",
    "SINGLE_METHODS",
    "MethodSpec",
    "PolicySpec",
    "candidate_fitter",
    "compare_rows",
    "fit_auto",
    "fit_policy",
    "load_policy",
    "method_help",
    "method_names",
    "parse_spec",
    "reference_candidate",
    "resolve_method",
    "rl_fitter",
    "select_method",
    "single_form_of",
    "stopping_fitter",
    "variant_name",
]


def load_policy(folder: str | Path) -> Policy:
    """The policy of a folder, by its policy.json: single-answer (``"answer": "single"``),
    CStop or a fixed rule (``method`` a score method), else CCPO / CPO."""
    meta = read_meta(folder)  # parsed once, handed to the class
    if meta.get("method") == REFERENCE_METHOD:
        return ReferencePolicy.load(folder, meta)
    if meta.get("route"):
        routed = RoutedPolicy if meta.get("answer") == "single" else RoutedSetPolicy
        return routed.load(folder, meta)
    if meta.get("answer") == "single":
        return SingleAnswerPolicy.load(folder, meta)
    if meta.get("method") in FIXED_RULES:
        return RulePolicy.load(folder, meta)
    if meta.get("method") in STOPPING_METHODS:
        return StoppingPolicy.load(folder, meta)
    return RLPolicy.load(folder, meta)


# ----------------------------------------------------------------------------- by name
def fit_policy(
    method: str,
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    *,
    single: bool = False,
    delta: float = DELTA,
    train_config: TrainConfig | None = None,
    settings: dict[str, Any] | None = None,
    progress: Any = None,
    routed: bool = False,
    route_embeddings: bool = False,
    latency_budget: float | None = None,
    candidates: Sequence[str] = (),
) -> Policy:
    """Fit any method by name on ``train_idx``, not calibrated yet (:func:`parse_spec` of its
    options, then :func:`~ccpo.policies.pipeline.train_policy`)."""
    spec = parse_spec(
        method, answer="single" if single else "set", route=routed,
        route_embeddings=route_embeddings, delta=delta, settings=settings,
        train_config=train_config, latency_budget=latency_budget, candidates=tuple(candidates),
    )  # fmt: skip
    return train_policy(spec, ep, train_idx, alpha, seed, progress=progress).policy
