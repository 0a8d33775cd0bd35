"""Resolve policy names (and trained policy folders) into the harness's rows (:class:`Row`).

Names (docs/design.md, "Results file"): ``random``, ``base``, ``guide``, ``uala``, ``oracle``,
``llm-policy:<model>``, ``cpo``, ``cpo-batch``, ``cpo-online``, ``ccpo``, ``ccpo-lam<λ>``,
``prompt-router`` (no guarantee: :mod:`ccpo.evaluation.prompt_router`), or the path of a
folder written by ``ccpo train``. Trained rows share one training run per
(method, λ): ``cpo``, ``cpo-batch`` and ``cpo-online`` are the same CPO π scored three ways.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.evaluation.prompt_router import NAME as PROMPT_ROUTER
from ccpo.evaluation.prompt_router import PromptRouterRow
from ccpo.learning.baselines import BASELINES, Row, Splits, make_baseline
from ccpo.learning.config import TrainConfig
from ccpo.learning.replay import calibrate_kappa
from ccpo.learning.training import train
from ccpo.policies.base import Policy
from ccpo.policies.registry import (
    AUTO_CANDIDATES,
    AUTO_RL_STEPS,
    compare_rows,
    fit_method,
    fit_single_method,
    load_policy,
    resolve_method,
    single_form_of,
    variant_name,
)
from ccpo.policies.rl import RLPolicy
from ccpo.policies.route import SUFFIX as ROUTED
from ccpo.policies.single import DELTA, SUFFIX
from ccpo.traces.episodes import Episodes, Metrics, conformal_rollout

#: the single-answer rows of ``compare`` (:mod:`ccpo.policies.single`), beside the set rows
SINGLE_ROWS = ("cstop-single", "auto-single")
#: ``always-<model>``: call only the ladder's strongest model (the saving's yardstick)
ALWAYS = "always-"


@dataclass
class TrainingCache:
    """Trains each (method, λ) once per harness run and hands the result to every row."""

    base_config: TrainConfig = field(default_factory=TrainConfig)
    progress: Callable[[str, int, dict[str, float]], None] | None = None
    trained: dict[tuple[str, float], RLPolicy] = field(default_factory=dict)
    pending: dict[tuple[str, float], Future[RLPolicy]] = field(default_factory=dict)

    def submit(
        self,
        keys: Sequence[tuple[str, float]],
        ep: Episodes,
        train_idx: np.ndarray,
        alpha: float,
        pool: Executor,
    ) -> None:
        """Start training the missing (method, λ) policies in ``pool`` and return at once;
        :meth:`get` waits for each. Each run is seeded by its config, so the results equal
        :meth:`get`'s one by one; the progress callback sees each run once, at its last step."""
        for m, lam in dict.fromkeys(keys):
            if (m, lam) not in self.trained and (m, lam) not in self.pending:
                cfg = self._config(m, lam, alpha)
                self.pending[(m, lam)] = pool.submit(_train_one, cfg, ep, train_idx)

    def prefetch(
        self,
        keys: Sequence[tuple[str, float]],
        ep: Episodes,
        train_idx: np.ndarray,
        alpha: float,
        workers: int,
    ) -> None:
        """Train the missing (method, λ) policies in ``workers`` processes at once (a pool of
        its own: see :func:`training_pool`) and wait for all of them."""
        todo = [k for k in dict.fromkeys(keys) if k not in self.trained and k not in self.pending]
        if workers < 2 or len(todo) < 2:
            return
        with training_pool(min(workers, len(todo))) as pool:
            self.submit(todo, ep, train_idx, alpha, pool)
            keys_of = {fut: key for key, fut in self.pending.items()}
            for fut in as_completed(keys_of):
                self._finish(keys_of[fut])

    def _finish(self, key: tuple[str, float]) -> RLPolicy:
        self.trained[key] = self.pending.pop(key).result()
        if self.progress is not None:
            last = self.trained[key].log[-1] if self.trained[key].log else {}
            self.progress(variant_name(*key), self.base_config.steps, last)
        return self.trained[key]

    def _config(self, method: str, lam: float, alpha: float) -> TrainConfig:
        return replace(self.base_config, method=method, lam=lam, alpha=alpha)

    def get(
        self, method: str, lam: float, ep: Episodes, train_idx: np.ndarray, alpha: float
    ) -> RLPolicy:
        key = (method, lam)
        if key in self.pending:
            return self._finish(key)
        if key not in self.trained:
            cfg = self._config(method, lam, alpha)
            label = variant_name(method, lam)
            cb = (
                None
                if self.progress is None
                else (lambda step, entry: self.progress(label, step, entry))
            )  # type: ignore[misc]
            self.trained[key] = RLPolicy.from_result(train(ep, train_idx, cfg, cb), label)
        return self.trained[key]


def training_pool(workers: int) -> ProcessPoolExecutor:
    """Processes for training runs (spawned: no fork of a process holding torch threads)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _train_one(cfg: TrainConfig, ep: Episodes, train_idx: np.ndarray) -> RLPolicy:
    """One training run in a worker process (module level, so that it pickles)."""
    return RLPolicy.from_result(train(ep, train_idx, cfg), variant_name(cfg.method, cfg.lam))


def conformal_metrics(
    ep: Episodes, probs: np.ndarray, splits: Splits, alpha: float, kappa: float | None
) -> tuple[Metrics, np.ndarray]:
    """Score {π ≥ κ} on every test split: κ given (online), or split-conformal on each cal split."""
    if kappa is None:
        kappas = calibrate_kappa(ep, probs, alpha, splits.cal)
    else:
        kappas = np.full(splits.n_splits, float(kappa))
    return conformal_rollout(ep, probs, kappas, splits.test), kappas


def last_threshold(thresholds: np.ndarray) -> np.ndarray:
    """κ̂ or λ̂ of each split: a routed policy's split thresholds are (τ̂, λ̂) pairs."""
    t = np.asarray(thresholds)
    return t.reshape(len(t), -1)[:, -1]


class PolicyRow(Row):
    """A row backed by a :class:`ccpo.policies.Policy` (``self.policy``, set by ``fit``):
    scored on every test split at the threshold it calibrates on the matching calibration
    split (split conformal or Learn-then-Test), at its online κ, or greedily."""

    kind = "conformal"
    policy: Policy | None = None
    _thresholds: np.ndarray | None = None
    _refused: np.ndarray | None = None

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        pol = self.policy
        if pol is None:
            raise CCPOError(f"policy '{self.name}' was evaluated before it was fitted")
        scores = pol.episode_scores(ep)
        if pol.greedy:
            return pol.rollout(ep, scores, None, splits.test)
        self._thresholds, self._refused = pol.split_thresholds(ep, scores, splits.cal, alpha)
        return pol.rollout(ep, scores, self._thresholds, splits.test)

    def result_extra(self) -> dict[str, Any]:
        if self._thresholds is None:
            return {}
        return {"kappa_mean": float(last_threshold(self._thresholds).mean())}

    def auto_pick(self) -> dict[str, Any]:
        """``{"picked": name}`` when ``auto`` chose this row's technique, else ``{}``."""
        if self.policy is None or "auto" not in self.policy.info:
            return {}
        return {"picked": self.policy.info["auto"]["picked"]}


class TrainedRow(PolicyRow):
    """A row backed by a π trained in this run (shared through :class:`TrainingCache`) and
    used as the row's variant says (``cpo``: greedy; ``cpo-online``: online κ; else κ̂)."""

    def __init__(
        self, name: str, method: str, lam: float, greedy: bool, cache: TrainingCache
    ) -> None:
        self.name, self.method, self.lam, self.cache = name, method, lam, cache
        self.kind = "point" if greedy else "conformal"

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        trained = self.cache.get(self.method, self.lam, ep, train_idx, alpha)
        self.policy = replace(trained, variant=self.name)


class ScoreRow(PolicyRow):
    """A row backed by replay-trained membership scores: CStop, ``depth-k`` or ``auto``
    (:mod:`ccpo.policies.registry`), split-conformal κ̂ on each calibration split."""

    def __init__(
        self,
        name: str,
        candidates: Sequence[str] = AUTO_CANDIDATES,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.name, self.candidates, self.settings = name, tuple(candidates), settings

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        self.policy, _ = fit_method(
            self.name, ep, train_idx, alpha, seed, self.candidates, self.settings
        )

    def result_extra(self) -> dict[str, Any]:
        return {**self.auto_pick(), **super().result_extra()}


class ArtifactRow(PolicyRow):
    """A policy folder from ``ccpo train``; a calibrated one is re-calibrated on each split."""

    def __init__(self, folder: Path, policy: Policy) -> None:
        self.name, self.policy = folder.name, policy
        self.kind = "point" if policy.greedy else "conformal"

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        assert self.policy is not None
        if abs(self.policy.alpha - alpha) > 1e-12 and not self.policy.calibrates:
            how = "point" if self.policy.greedy else "online"
            raise CCPOError(
                f"{self.name} was trained for α = {self.policy.alpha:g}; its "
                f"{how} scoring cannot be re-targeted to α = {alpha:g}"
            )


class SingleRow(PolicyRow):
    """A single-answer row (``cstop-single``, ``auto-single``, …, or a folder): the stopping
    score fitted on the training split, λ̂ by Learn-then-Test on each calibration split; where
    a split cannot certify any λ the most conservative rule is scored and the split counted
    as refused (``refused_share``)."""

    kind = "single"

    def __init__(self, name: str, delta: float = DELTA, policy: Policy | None = None) -> None:
        """``policy``: a trained single-answer policy (a folder's), kept as it is by fit."""
        self.routed = name.endswith(ROUTED)  # ``…-single+route``: behind a router
        self.name, self.delta = name, delta
        self.method = name.removesuffix(ROUTED).removesuffix(SUFFIX)
        self.policy = policy
        self._given = policy is not None

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        if not self._given:
            self.policy = fit_single_method(
                self.method, ep, train_idx, alpha, seed, self.delta, routed=self.routed
            )

    def result_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answer": "single", "delta": self.delta, **self.auto_pick()}
        if self._thresholds is not None and self._refused is not None:
            out["refused_share"] = float(self._refused.mean())
            out["threshold_mean"] = float(last_threshold(self._thresholds).mean())
        return out


class AlwaysRow(Row):
    """``always-<model>``: every question answered by the ladder's strongest model alone (its
    last call that is not a reuse), paying only that call: the yardstick of the saving."""

    kind = "reference"

    def __init__(self, name: str) -> None:
        self.name, self.model = name, name.removeprefix(ALWAYS)

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        if ep.strongest != self.model or ep.strongest_cost is None:
            raise CCPOError(
                f"'{self.name}': the strongest model of these traces is "
                f"{ep.strongest or 'not one model'}; use always-{ep.strongest}"
            )
        assert ep.strongest_correct is not None
        test = splits.test
        ones = np.ones(test.shape, dtype=np.int64)
        return Metrics(
            cost=ep.strongest_cost[test],
            covered=ep.strongest_correct[test] | ~ep.solvable[test],
            length=ones,
            set_size=ones,
            latency=None if ep.strongest_latency is None else ep.strongest_latency[test],
        )


def available_policies(ep: Episodes, trained: bool = True) -> list[str]:
    """Every row these traces allow (LLM-as-policy rows only where decisions are stored).

    ``depth-k`` and ``agree-k`` are fixed rules (always there); ``cstop`` and ``auto`` are
    fitted, so they come with the ``trained`` rows."""
    names = [*BASELINES[:4], "depth-k", "agree-k"]
    names += [f"llm-policy:{m}" for m in sorted(ep.llm_actions)]
    names += [ALWAYS + ep.strongest] if ep.strongest else []
    if trained:
        names += [*compare_rows(), *SINGLE_ROWS]
    return [*names, "oracle"]


def make_policy(name: str, cache: TrainingCache) -> Row:
    """A row: a method of :mod:`ccpo.policies.registry`, a policy folder, or a baseline."""
    single = name.removesuffix(ROUTED)
    if single.endswith(SUFFIX) and single_form_of(single.removesuffix(SUFFIX)):
        return SingleRow(name)
    if name.startswith(ALWAYS):
        return AlwaysRow(name)
    if name == PROMPT_ROUTER:
        return PromptRouterRow()
    found = resolve_method(name)
    if found is not None:
        spec, lam = found
        if spec.fitted_on_replay:
            # auto's CCPO candidate trains no longer than the run's other policies
            steps = min(cache.base_config.steps, AUTO_RL_STEPS)
            return ScoreRow(name, settings={"auto_ccpo_steps": steps})
        assert spec.trainer is not None
        return TrainedRow(name, spec.trainer, lam, spec.greedy, cache)
    p = Path(name)
    if p.is_dir() and (p / "policy.json").is_file():
        pol = load_policy(p)
        if pol.single:
            return SingleRow(p.name, pol.delta or DELTA, pol)
        return ArtifactRow(p, pol)
    try:
        # a baseline's name wins over a folder of that name that holds no policy
        return make_baseline(name)
    except CCPOError:
        if p.is_dir():
            load_policy(p)  # raises: says the folder is not a trained policy
        raise


def resolve_policies(
    names: Sequence[str], ep: Episodes, cache: TrainingCache | None = None, trained: bool = False
) -> list[Row]:
    """``all`` expands to :func:`available_policies` (trained rows when ``trained``)."""
    cache = cache or TrainingCache()
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if part:
                out.extend(available_policies(ep, trained) if part == "all" else [part])
    if not out:
        raise CCPOError("no policy given; pass --policy NAME")
    return [make_policy(n, cache) for n in dict.fromkeys(out)]
