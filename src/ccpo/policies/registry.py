"""The registry: every technique by name, the one module that imports them all.

Every name ``ccpo train --method``, the rows of ``compare`` / ``evaluate``, the Python API and
:func:`load_policy` accept is written here once (:data:`METHODS`). A method is of one of two
kinds: ``score`` (fitted on replayed traces: CStop, the fixed rules, and ``auto``, which picks
among them and CCPO) or ``rl`` (a π trained by :mod:`ccpo.learning.training`). Each method
with ``--answer single`` has a single-answer form (:data:`SINGLE_METHODS`).

Main names: :func:`load_policy` (a folder → its :class:`~ccpo.policies.base.Policy`),
:func:`fit_policy` (any method by name), :func:`fit_method` (sets fitted on replay),
:func:`fit_single_method` (single answer), :func:`resolve_method`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import StopConfig, TrainConfig
from ccpo.learning.replay import calibrated_rollout
from ccpo.policies.auto import Direct, Fitter, Selection, cross_fit
from ccpo.policies.base import Policy
from ccpo.policies.cstop import STOPPING_METHODS, StoppingPolicy, fit_stopping
from ccpo.policies.folder import read_meta
from ccpo.policies.reference import METHOD as REFERENCE_METHOD
from ccpo.policies.reference import (
    ReferencePolicy,
    callable_alone,
    reference_name,
    reference_validator,
)
from ccpo.policies.rl import RLPolicy
from ccpo.policies.route import RoutedPolicy, route
from ccpo.policies.route_sets import RoutedSetPolicy, route_set_policy
from ccpo.policies.rules import FIXED_RULES, RulePolicy
from ccpo.policies.single import (
    DELTA,
    SINGLE_METHODS,
    SingleAnswerPolicy,
    fit_single,
    validation_figures,
)
from ccpo.traces.episodes import Episodes
from ccpo.traces.latency import mean_latency

#: the methods fitted on replayed traces (membership scores of a set policy)
SCORE_METHODS = (*STOPPING_METHODS, *FIXED_RULES)
#: what ``--method auto`` chooses among by default: the score methods and CCPO in bounded time
AUTO_CANDIDATES = ("cstop", "cstop-lr", "depth-k", "agree-k", "ccpo")
#: CCPO training steps per cross-fitting fold (and for the refit) inside ``auto``: K = 5 folds
#: and one refit, 6 × 300 steps, about as many as one default ``train --method ccpo``
AUTO_RL_STEPS = 300
#: candidates of ``auto`` trained by :func:`ccpo.learning.training.train`
RL_CANDIDATES = ("ccpo",)

Kind = Literal["score", "rl"]
Scoring = Literal["batch", "point", "online"]


@dataclass(frozen=True)
class MethodSpec:
    """One learning method: what fits it and how its π is scored."""

    name: str
    kind: Kind
    help: str  # one line for --help and error messages
    trainer: Literal["ccpo", "cpo"] | None = None  # rl: TrainConfig.method
    scoring: Scoring = "batch"  # rl: greedy "point", split-conformal "batch", "online" κ
    compare: bool = True  # a row of `compare` / `evaluate --policy all` with trained rows

    @property
    def calibrates(self) -> bool:
        """Its threshold is calibrated on held-out questions (split conformal)."""
        return self.scoring == "batch"

    @property
    def greedy(self) -> bool:
        """Its π is used greedily: no set, no threshold."""
        return self.scoring == "point"

    @property
    def fitted_on_replay(self) -> bool:
        """Fitted on replayed traces (no torch), rather than trained by RL."""
        return self.kind == "score"


_SPECS = (
    MethodSpec(
        "auto",
        "score",
        "cross-fits cstop, cstop-lr, depth-k, agree-k and ccpo (300 steps a fold), keeps the "
        "least validation calibrated cost",
    ),
    MethodSpec("cstop", "score", "CStop: gradient-boosted continuation score, conformal κ̂"),
    MethodSpec("cstop-lr", "score", "CStop with a logistic-regression score", compare=False),
    MethodSpec("depth-k", "score", "run the least k rounds that reach 1 − α", compare=False),
    MethodSpec("agree-k", "score", "stop when the guide agrees, at most k rounds", compare=False),
    MethodSpec("cpo", "rl", "CPO π, greedy point policy (no set)", "cpo", "point"),
    MethodSpec("cpo-batch", "rl", "CPO π, then split-conformal κ̂", "cpo", "batch"),
    MethodSpec("cpo-online", "rl", "CPO π with the online κ tracker", "cpo", "online"),
    MethodSpec("ccpo", "rl", "CCPO, the paper's Algorithm 1", "ccpo"),
)
METHODS: dict[str, MethodSpec] = {s.name: s for s in _SPECS}

_LAM = re.compile(r"^ccpo-lam(?P<lam>[0-9.eE+-]+)$")


# ----------------------------------------------------------------------------- names
def variant_name(method: str, lam: float = 0.0) -> str:
    """The name a trained policy carries and its row is shown under: the method (``ccpo``,
    ``cpo``, ``cpo-batch``, …), or ``ccpo-lam<λ>`` for CCPO with a set-size price λ > 0."""
    return f"{method}-lam{lam:g}" if lam and method == "ccpo" else method


def method_names() -> str:
    """``auto, cstop, …, cpo-online`` (for messages)."""
    return ", ".join(METHODS)


def method_help() -> str:
    """One paragraph naming every method and what it does (for ``--method`` help)."""
    return "; ".join(f"{s.name}: {s.help}" for s in _SPECS) + "; ccpo-lam<λ>: CCPO with λ."


def resolve_method(name: str) -> tuple[MethodSpec, float] | None:
    """(spec, λ) of a method name, ``ccpo-lam<λ>`` included; ``None`` when it names no method
    (it may still name a baseline row or a policy folder)."""
    if name in METHODS:
        return METHODS[name], 0.0
    m = _LAM.match(name)
    if m is None:
        return None
    try:
        lam = float(m.group("lam"))
    except ValueError:
        raise CCPOError(f"cannot read λ in '{name}' (try ccpo-lam0.5)") from None
    if lam < 0:
        raise CCPOError(f"λ must be >= 0 in '{name}'")
    return METHODS["ccpo"], lam


def compare_rows() -> list[str]:
    """The method rows of ``compare``: the RL variants, the fitted score methods, and ``auto``
    last (the product's own pick closes the list)."""
    rows = [s.name for kind in ("rl", "score") for s in _SPECS if s.kind == kind and s.compare]
    return [r for r in rows if r != "auto"] + ["auto"]


# ----------------------------------------------------------------------------- loading
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


# ----------------------------------------------------------------------------- fitting
def rl_fitter(method: str = "ccpo", steps: int = AUTO_RL_STEPS) -> Fitter:
    """A fitter training ``method`` (``ccpo``) for ``steps`` steps with the default
    :class:`TrainConfig` otherwise; scored as a batch (split-conformal κ̂) policy."""

    def fit(ep: Episodes, idx: np.ndarray, alpha: float, seed: int) -> Policy:
        from ccpo.learning.training import train  # torch: only when CCPO is a candidate

        cfg = TrainConfig(method=method, alpha=alpha, seed=seed, steps=steps)
        return RLPolicy.from_result(train(ep, np.asarray(idx), cfg), method)

    return fit


def stopping_fitter(method: str, settings: dict[str, Any] | None = None) -> Fitter:
    """(ep, idx, α, seed) → fitted set policy for a CStop method or a fixed rule;
    ``settings``: other :class:`StopConfig` fields (the learner's hyperparameters)."""
    kw = dict(settings or {})
    if method in FIXED_RULES:
        return lambda ep, idx, alpha, seed: RulePolicy(
            None, ep.horizon, StopConfig(alpha=alpha, seed=seed, **kw), variant=method
        )
    if method not in STOPPING_METHODS:
        raise CCPOError(f"unknown method '{method}' (stopping methods: {', '.join(SCORE_METHODS)})")
    kw["learner"] = STOPPING_METHODS[method]
    return lambda ep, idx, alpha, seed: fit_stopping(
        ep, idx, StopConfig(alpha=alpha, seed=seed, **kw), variant=method
    )


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


def reference_candidate(ep: Episodes, alpha: float, on: bool = True) -> dict[str, Direct]:
    """``auto``'s ``always-<reference>`` candidate, where these traces can call that model
    alone (:mod:`ccpo.policies.reference`); none when ``on`` is false."""
    if not (on and callable_alone(ep)):
        return {}
    figures = reference_validator(alpha, DELTA)

    def with_latency(sub: Episodes) -> tuple[float, ...]:
        known = sub.strongest_latency is not None and sub.n > 0
        return (*figures(sub), float(np.mean(sub.strongest_latency)) if known else float("nan"))

    return {reference_name(ep.strongest): with_latency}


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
    """``--method auto``: :func:`select_method`, then the winner refitted on all of
    ``train_idx``; its ``info`` records the choice and the validation figures. With
    ``reference``, calling the reference alone is a candidate (kept when nothing is
    cheaper); with ``latency_budget``, only candidates within it are eligible."""
    direct = reference_candidate(ep, alpha, reference)
    sel = select_method(ep, train_idx, alpha, candidates, fitters, seed=seed, direct=direct,
                        latency_budget=latency_budget)  # fmt: skip
    if sel.method in direct:
        policy: Policy = ReferencePolicy.fit(ep, "set", StopConfig(alpha=alpha, seed=seed))
    else:
        fit = (fitters or {}).get(sel.method) or candidate_fitter(sel.method)
        policy = fit(ep, np.asarray(train_idx), alpha, seed)
    policy.info = {"auto": sel.to_json()}
    return policy, sel


def fit_method(
    method: str,
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    settings: dict[str, Any] | None = None,
    latency_budget: float | None = None,
) -> tuple[Policy, Selection | None]:
    """Fit ``auto`` (with its :class:`Selection`) or one of :data:`SCORE_METHODS` (selection
    ``None``): the one entry point of the CLI, the API and the harness for set policies
    fitted on replay. ``settings``: :class:`StopConfig` fields other than α, seed, learner;
    ``latency_budget``: ``auto`` chooses among the candidates within it."""
    if method == "auto":
        if (settings or {}).get("auto_ccpo_steps", 1) == 0:
            candidates = [c for c in candidates if c != "ccpo"]
        fitters = {name: candidate_fitter(name, settings) for name in candidates}
        ref = (settings or {}).get("auto_reference", True)
        return fit_auto(ep, train_idx, alpha, seed, candidates, fitters, ref, latency_budget)
    return stopping_fitter(method, settings)(ep, train_idx, alpha, seed), None


def fit_single_method(
    method: str,
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    delta: float = DELTA,
    candidates: Sequence[str] = SINGLE_METHODS,
    settings: dict[str, Any] | None = None,
    folds: int = 5,
    routed: bool = False,
    route_embeddings: bool = False,
    latency_budget: float | None = None,
) -> Policy:
    """The one entry point for ``--answer single``: ``auto`` cross-fits ``candidates`` on the
    training questions, scores each by :func:`~ccpo.policies.single.validation_cost` of its
    out-of-fold scores and refits the cheapest on all of ``train_idx`` (its choice in
    ``info["auto"]``), or keeps calling the reference alone when nothing is cheaper
    (:mod:`ccpo.policies.reference`); any other name is fitted as is. ``routed``: behind a
    router fitted on the same questions (:mod:`ccpo.policies.route`), reading their recorded
    embeddings too with ``route_embeddings``. ``latency_budget``: ``auto`` chooses among the
    candidates within it (unrouted validation latency)."""
    if routed:
        inner = fit_single_method(method, ep, train_idx, alpha, seed, delta, candidates, settings,
                                  latency_budget=latency_budget)  # fmt: skip
        if isinstance(inner, ReferencePolicy):  # one model alone: no rung to skip
            return inner
        return route(inner, ep, train_idx, seed, embedded=route_embeddings)
    kw = {k: v for k, v in (settings or {}).items() if k not in ("alpha", "seed", "learner")}
    cfg = StopConfig(alpha=alpha, seed=seed, **kw)
    if method != "auto":
        return fit_single(ep, train_idx, cfg, method, delta)

    def fitter(name: str) -> Fitter:
        return lambda e, idx, _alpha, _seed: fit_single(e, idx, cfg, name, delta)

    def validate(sub: Episodes, scores: np.ndarray) -> tuple[float, float, float]:
        return validation_figures(sub, scores, alpha, delta, seed=seed)

    fitters = {name: fitter(name) for name in candidates}
    direct = reference_candidate(ep, alpha, cfg.auto_reference)
    sel = cross_fit(ep, train_idx, alpha, fitters, validate, seed, folds, 0xA071, direct,
                    latency_budget)  # fmt: skip
    if sel.method in direct:
        policy: Policy = ReferencePolicy.fit(ep, "single", cfg, delta)
    else:
        policy = fit_single(ep, np.asarray(train_idx), cfg, sel.method, delta)
    policy.info = {"auto": sel.to_json()}
    return policy


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
    latency_budget: float | None = None,
) -> Policy:
    """Fit any method by name on ``train_idx``, not calibrated yet: its single-answer form
    (``single``), a method fitted on replay (``auto`` included), or an RL method trained by
    :func:`ccpo.learning.training.train` with ``train_config`` (defaults otherwise; its method,
    α, seed and λ are the method's). ``progress(step, entry)``: RL training steps.
    ``latency_budget``: ``auto`` chooses among the candidates within it."""
    pol = _fit_policy(method, ep, train_idx, alpha, seed, single, delta, train_config, settings,
                      progress, routed, latency_budget)  # fmt: skip
    pol.feature_spec = ep.feature_spec  # the observations it was fitted on (ladder signals)
    return pol


def _fit_policy(
    method, ep, train_idx, alpha, seed, single, delta, train_config, settings, progress, routed,
    latency_budget=None,
) -> Policy:  # fmt: skip
    if single:
        return fit_single_method(method, ep, train_idx, alpha, seed, delta, settings=settings,
                                 routed=routed, latency_budget=latency_budget)  # fmt: skip
    if routed:  # a CStop set behind a router; any other pick is kept unrouted
        got = _fit_policy(method, ep, train_idx, alpha, seed, single, delta, train_config,
                          settings, progress, False, latency_budget)  # fmt: skip
        return route_set_policy(got, ep, train_idx, seed)
    found = resolve_method(method)
    if found is None:
        raise CCPOError(f"unknown method '{method}' (methods: {method_names()}, ccpo-lam<λ>)")
    spec, lam = found
    if spec.fitted_on_replay:
        got = fit_method(method, ep, train_idx, alpha, seed, settings=settings,
                         latency_budget=latency_budget)  # fmt: skip
        return got[0]
    from ccpo.learning.training import train  # torch: only for CCPO / CPO

    base = train_config or TrainConfig()
    assert spec.trainer is not None
    cfg = replace(base, method=spec.trainer, alpha=alpha, seed=seed, lam=lam or base.lam)
    res = train(ep, np.asarray(train_idx), cfg, progress)
    return RLPolicy.from_result(res, variant_name(spec.name, cfg.lam))


def single_form_of(method: str) -> bool:
    """Whether ``method`` has a single-answer form (``--answer single``)."""
    return method in ("auto", *SINGLE_METHODS)
