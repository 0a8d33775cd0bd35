"""``auto``: the candidate of least cross-fitted validation cost (:func:`ccpo.policies.auto.
cross_fit`), refitted on every training question, or calling the reference alone when nothing
is cheaper; the choice is in the policy's ``info["auto"]``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ccpo.learning.config import StopConfig
from ccpo.learning.replay import calibrated_rollout
from ccpo.policies.auto import Direct, Fitter, Selection, as_figures, cross_fit
from ccpo.policies.base import Policy
from ccpo.policies.budget import COST, pick
from ccpo.policies.reference import ReferencePolicy
from ccpo.policies.risk_control import test_level
from ccpo.policies.routing.single import RoutedPolicy, routed_fit, routed_validation
from ccpo.policies.single import GRID, SINGLE_METHODS, validation_figures
from ccpo.policies.spec import PolicySpec
from ccpo.policies.techniques.reference import reference_candidate
from ccpo.policies.techniques.rl import AUTO_RL_STEPS, rl_fitter
from ccpo.policies.techniques.stopping import single_config, single_fitter, stopping_fitter
from ccpo.traces.episodes import Episodes
from ccpo.traces.latency import mean_latency

NAMES = ("auto",)
#: what ``--method auto`` chooses among by default: the score methods and CCPO in bounded time
AUTO_CANDIDATES = ("cstop", "cstop-lr", "depth-k", "agree-k", "ccpo")
#: candidates of ``auto`` trained by :func:`ccpo.learning.training.train`
RL_CANDIDATES = ("ccpo",)
#: the routed candidates of ``auto`` of one answer, where the ladder can be routed: a router
#: before any call (``router``), and the cheapest cascade behind it (``both``)
ROUTED = ("router", "both")


def fit(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
    progress: Any = None,
) -> Policy:  # fmt: skip
    """``auto`` of ``spec``'s answer kind among ``spec.candidates`` (the default ones when
    empty; CCPO left out with ``auto_ccpo_steps = 0``), within ``spec.latency_budget``."""
    settings = dict(spec.settings)
    if spec.single:
        return _fit_single(spec, ep, train_idx, alpha, seed)
    candidates = spec.candidates or AUTO_CANDIDATES
    if settings.get("auto_ccpo_steps", 1) == 0:
        candidates = tuple(c for c in candidates if c not in RL_CANDIDATES)
    fitters = {name: candidate_fitter(name, settings) for name in candidates}
    ref = settings.get("auto_reference", True)
    policy, _ = fit_auto(ep, train_idx, alpha, seed, candidates, fitters, ref, spec.latency_budget)
    return policy


def candidate_fitter(name: str, settings: dict[str, Any] | None = None) -> Fitter:
    """The fitter of an ``auto`` candidate: a score method (with the learner's ``settings``)
    or an RL method in bounded time (``settings["auto_ccpo_steps"]`` steps)."""
    if name in RL_CANDIDATES:
        return rl_fitter(name, (settings or {}).get("auto_ccpo_steps", AUTO_RL_STEPS))
    return stopping_fitter(name, settings)


def select_method(
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    fitters: dict[str, Fitter] | None = None,
    folds: int = 5,
    seed: int = 0,
    direct: dict[str, Direct] | None = None,
    latency_budget: float | None = None,
) -> Selection:
    """The set-valued candidate of least validation calibrated cost (:func:`cross_fit`,
    validated by :func:`ccpo.learning.replay.calibrated_cost`; ``direct``: candidates with
    nothing to fit; ``latency_budget``: only candidates within it are eligible)."""
    given = fitters or {}
    chosen = {name: given.get(name) or candidate_fitter(name) for name in candidates}

    def validate(sub: Episodes, probs: np.ndarray) -> tuple[float, float, float]:
        m, test = calibrated_rollout(sub, probs, alpha)
        latency = mean_latency(sub.round_latency, test, m)
        return float(m.cost.mean()), float(m.covered.mean()), latency

    return cross_fit(ep, train_idx, alpha, chosen, validate, seed, folds,
                     direct=direct, latency_budget=latency_budget)  # fmt: skip


def fit_auto(
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    fitters: dict[str, Fitter] | None = None,
    reference: bool = True,
    latency_budget: float | None = None,
) -> tuple[Policy, Selection]:
    """:func:`select_method`, then the winner refitted on all of ``train_idx``; its ``info``
    records the choice and the validation figures. With ``reference``, calling the reference
    alone is a candidate (kept when nothing is cheaper); with ``latency_budget``, only
    candidates within it are eligible."""
    direct = reference_candidate(ep, alpha, reference)
    sel = select_method(ep, train_idx, alpha, candidates, fitters, seed=seed, direct=direct,
                        latency_budget=latency_budget)  # fmt: skip
    if sel.method in direct:
        policy: Policy = ReferencePolicy.fit(ep, "set", StopConfig(alpha=alpha, seed=seed))
    else:
        fit_one = (fitters or {}).get(sel.method) or candidate_fitter(sel.method)
        policy = fit_one(ep, np.asarray(train_idx), alpha, seed)
    policy.info = {"auto": sel.to_json()}
    return policy, sel


def _fit_single(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
    folds: int = 5,
) -> Policy:  # fmt: skip
    """``auto`` of one answer: each cascade's out-of-fold stopping scores validated by
    :func:`~ccpo.policies.single.validation_figures`; then, where the ladder can be routed,
    the router alone and the cheapest cascade behind the router (:func:`routed_candidates`);
    the cheapest of all (or calling the reference alone), refitted on every training
    question."""
    cfg = single_config(spec.settings, alpha, seed)
    candidates = tuple(c for c in (spec.candidates or SINGLE_METHODS) if c not in ROUTED)
    fitters = {name: single_fitter(name, spec.settings, spec.delta) for name in candidates}

    level = test_level(cfg.guarantee, spec.delta)
    like = spec.calibration_size  # validated as train's calibration split will test

    def validate(sub: Episodes, scores: np.ndarray) -> tuple[float, float, float]:
        return validation_figures(sub, scores, alpha, level, seed=seed, like=like)

    direct = reference_candidate(ep, alpha, cfg.auto_reference, level, like)
    sel = cross_fit(ep, train_idx, alpha, fitters, validate, seed, folds, 0xA071, direct,
                    spec.latency_budget)  # fmt: skip
    routed: dict[str, RoutedPolicy] = {}
    wanted = [c for c in ROUTED if c in spec.candidates] if spec.candidates else list(ROUTED)
    if wanted and cfg.auto_route and ep.routes is not None:
        cascades = {n: f for n, f in sel.figures.items() if n in fitters}
        best = min(cascades, key=lambda n: cascades[n][COST])
        figures, routed = routed_candidates(spec, ep, train_idx, alpha, seed, best, wanted)
        merged = {**sel.figures, **figures}
        sel = Selection(pick(merged, spec.latency_budget), merged, sel.folds, sel.latency_budget)
    if sel.method in direct:
        policy: Policy = ReferencePolicy.fit(ep, "single", cfg, spec.delta)
    elif sel.method in routed:
        policy = routed[sel.method]
    else:
        policy = fitters[sel.method](ep, np.asarray(train_idx), alpha, seed)
    policy.info = {"auto": sel.to_json()}
    return policy


def routed_candidates(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int,
    cascade: str, which: Sequence[str] = ROUTED,
) -> tuple[dict[str, dict[str, float]], dict[str, RoutedPolicy]]:  # fmt: skip
    """The routed candidates of a single answer (``which`` of :data:`ROUTED`), each fitted on
    ``train_idx`` with its validation figures from out-of-fold scores there
    (:func:`~ccpo.policies.routing.single.routed_validation`): ``router``, a router before
    any call whose start round's reply is returned (``depth-k`` behind it, λ ∈ {0: stop at
    the start, 1: run to the last round}), and ``both``, the cascade ``cascade`` behind the
    router (its Pareto sequence over every λ)."""
    fit = {"router": ("depth-k", 1), "both": (cascade, GRID)}
    figures: dict[str, dict[str, float]] = {}
    policies: dict[str, RoutedPolicy] = {}
    for name in which:
        method, grid = fit[name]
        inner = single_fitter(method, spec.settings, spec.delta)(ep, train_idx, alpha, seed)
        pol, sub, sc = routed_fit(inner, ep, train_idx, seed, embedded=spec.route_embeddings,
                                  grid=grid)  # fmt: skip
        assert pol.sequence is not None
        got = routed_validation(sub, sc, pol.sequence, alpha, pol.inner.level, seed)
        key = name if name == "router" else f"{cascade}+route"
        figures[key], policies[key] = as_figures(got), pol
    return figures, policies
