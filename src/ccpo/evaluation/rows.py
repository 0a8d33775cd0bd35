"""Resolve policy names (and trained policy folders) into harness :class:`Policy` objects.

Names (DESIGN.md "Results file"): ``random``, ``base``, ``guide``, ``uala``, ``oracle``,
``llm-policy:<model>``, ``cpo``, ``cpo-batch``, ``cpo-online``, ``ccpo``, ``ccpo-lam<λ>``, or the
path of a folder written by ``ccpo train``. Trained rows share one training run per
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
from ccpo.learning.baselines import BASELINES, Policy, Splits, make_baseline
from ccpo.learning.candidates import AUTO_RL_STEPS
from ccpo.learning.methods import compare_rows, resolve_method, variant_name
from ccpo.learning.policy import TrainedPolicy, load_policy
from ccpo.learning.replay import calibrate_kappa
from ccpo.learning.single import DELTA, SINGLE_METHODS, SUFFIX, calibrate_splits
from ccpo.learning.stopping import AUTO_CANDIDATES, fit_method
from ccpo.learning.trainers import TrainConfig, train
from ccpo.traces.episodes import (
    Episodes,
    Metrics,
    conformal_rollout,
    point_rollout,
    single_rollout,
)

#: the single-answer rows of ``compare`` (:mod:`ccpo.learning.single`), beside the set rows
SINGLE_ROWS = ("cstop-single", "auto-single")
#: ``always-<model>``: call only the ladder's strongest model (the saving's yardstick)
ALWAYS = "always-"


@dataclass
class TrainingCache:
    """Trains each (method, λ) once per harness run and hands the result to every row."""

    base_config: TrainConfig = field(default_factory=TrainConfig)
    progress: Callable[[str, int, dict[str, float]], None] | None = None
    trained: dict[tuple[str, float], TrainedPolicy] = field(default_factory=dict)
    pending: dict[tuple[str, float], Future[TrainedPolicy]] = field(default_factory=dict)

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

    def _finish(self, key: tuple[str, float]) -> TrainedPolicy:
        self.trained[key] = self.pending.pop(key).result()
        if self.progress is not None:
            last = self.trained[key].log[-1] if self.trained[key].log else {}
            self.progress(variant_name(*key), self.base_config.steps, last)
        return self.trained[key]

    def _config(self, method: str, lam: float, alpha: float) -> TrainConfig:
        return replace(self.base_config, method=method, lam=lam, alpha=alpha)

    def get(
        self, method: str, lam: float, ep: Episodes, train_idx: np.ndarray, alpha: float
    ) -> TrainedPolicy:
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
            self.trained[key] = TrainedPolicy.from_result(train(ep, train_idx, cfg, cb), label)
        return self.trained[key]


def training_pool(workers: int) -> ProcessPoolExecutor:
    """Processes for training runs (spawned: no fork of a process holding torch threads)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _train_one(cfg: TrainConfig, ep: Episodes, train_idx: np.ndarray) -> TrainedPolicy:
    """One training run in a worker process (module level, so that it pickles)."""
    return TrainedPolicy.from_result(train(ep, train_idx, cfg), variant_name(cfg.method, cfg.lam))


def conformal_metrics(
    ep: Episodes, probs: np.ndarray, splits: Splits, alpha: float, kappa: float | None
) -> tuple[Metrics, np.ndarray]:
    """Score {π ≥ κ} on every test split: κ given (online), or split-conformal on each cal split."""
    if kappa is None:
        kappas = calibrate_kappa(ep, probs, alpha, splits.cal)
    else:
        kappas = np.full(splits.n_splits, float(kappa))
    return conformal_rollout(ep, probs, kappas, splits.test), kappas


def score_trained(
    policy: TrainedPolicy, scoring: str, ep: Episodes, splits: Splits, alpha: float
) -> tuple[Metrics, np.ndarray | None]:
    """Score a trained π on every test split: greedy point policy, online κ, or batch κ̂."""
    probs = policy.probs(ep.obs)
    if scoring == "point":
        greedy = np.where(ep.allowed, probs, -1.0).argmax(-1)
        return point_rollout(ep, greedy[splits.test], splits.test), None
    kappa = policy.kappa_online if scoring == "online" else None
    return conformal_metrics(ep, probs, splits, alpha, kappa)


class TrainedRow(Policy):
    """A row backed by a π trained in this run (shared through :class:`TrainingCache`)."""

    def __init__(
        self, name: str, method: str, lam: float, scoring: str, cache: TrainingCache
    ) -> None:
        self.name, self.method, self.lam, self.scoring = name, method, lam, scoring
        self.cache = cache
        self.kind = "point" if scoring == "point" else "conformal"
        self.policy: TrainedPolicy | None = None
        self._kappas: np.ndarray | None = None

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        self.policy = self.cache.get(self.method, self.lam, ep, train_idx, alpha)

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        if self.policy is None:
            raise CCPOError(f"policy '{self.name}' was evaluated before it was fitted")
        m, self._kappas = score_trained(self.policy, self.scoring, ep, splits, alpha)
        return m

    def result_extra(self) -> dict[str, Any]:
        return {} if self._kappas is None else {"kappa_mean": float(self._kappas.mean())}


class ScoreRow(Policy):
    """A row backed by replay-trained membership scores: CStop, ``depth-k`` or ``auto``
    (:mod:`ccpo.learning.stopping`), split-conformal κ̂ on each calibration split."""

    kind = "conformal"

    def __init__(
        self,
        name: str,
        candidates: Sequence[str] = AUTO_CANDIDATES,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.name, self.candidates, self.settings = name, tuple(candidates), settings
        self.policy: Any = None
        self.choice: dict[str, Any] = {}
        self._kappas: np.ndarray | None = None

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        self.policy, sel = fit_method(
            self.name, ep, train_idx, alpha, seed, self.candidates, self.settings
        )
        self.choice = {} if sel is None else {"picked": sel.method}

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        if self.policy is None:
            raise CCPOError(f"policy '{self.name}' was evaluated before it was fitted")
        m, self._kappas = conformal_metrics(ep, self.policy.probs(ep.obs), splits, alpha, None)
        return m

    def result_extra(self) -> dict[str, Any]:
        out = dict(self.choice)
        if self._kappas is not None:
            out["kappa_mean"] = float(self._kappas.mean())
        return out


class ArtifactRow(TrainedRow):
    """A policy folder from ``ccpo train``; batch variants are re-calibrated on each split."""

    def __init__(self, folder: Path, cache: TrainingCache) -> None:
        policy = load_policy(folder)
        method = getattr(policy.config, "method", policy.variant)
        super().__init__(
            folder.name, method, getattr(policy.config, "lam", 0.0), policy.scoring, cache
        )
        self.policy = policy

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        assert self.policy is not None
        if abs(self.policy.alpha - alpha) > 1e-12 and self.scoring != "batch":
            raise CCPOError(
                f"{self.name} was trained for α = {self.policy.alpha:g}; its "
                f"{self.scoring} scoring cannot be re-targeted to α = {alpha:g}"
            )


class SingleRow(Policy):
    """A single-answer row (``cstop-single``, ``auto-single``, …): the stopping score fitted
    on the training split, λ̂ by Learn-then-Test on each calibration split; where a split
    cannot certify any λ the most conservative rule is scored and the split counted as
    refused (``refused_share``)."""

    kind = "single"

    def __init__(self, name: str, delta: float = DELTA, policy: Any = None) -> None:
        """``policy``: a trained single-answer policy (a folder's), kept as it is by fit."""
        self.name, self.method, self.delta = name, name.removesuffix(SUFFIX), delta
        self.policy: Any = policy
        self._given = policy is not None
        self._lams: np.ndarray | None = None
        self._refused: np.ndarray | None = None

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        from ccpo.learning.single import fit_single_method

        if not self._given:
            self.policy = fit_single_method(self.method, ep, train_idx, alpha, seed, self.delta)

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        if self.policy is None:
            raise CCPOError(f"policy '{self.name}' was evaluated before it was fitted")
        h = self.policy.stop_scores(ep.obs)
        self._lams, self._refused = calibrate_splits(ep, h, alpha, self.delta, splits.cal)
        return single_rollout(ep, h, self._lams, splits.test)

    def result_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answer": "single", "delta": self.delta}
        if self.policy is not None and "auto" in self.policy.info:
            out["picked"] = self.policy.info["auto"]["picked"]
        if self._lams is not None and self._refused is not None:
            out["refused_share"] = float(self._refused.mean())
            out["threshold_mean"] = float(self._lams.mean())
        return out


class AlwaysRow(Policy):
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


def make_policy(name: str, cache: TrainingCache) -> Policy:
    """A row: a method of :mod:`ccpo.learning.methods`, a policy folder, or a baseline."""
    if name.endswith(SUFFIX) and name.removesuffix(SUFFIX) in ("auto", *SINGLE_METHODS):
        return SingleRow(name)
    if name.startswith(ALWAYS):
        return AlwaysRow(name)
    found = resolve_method(name)
    if found is not None:
        spec, lam = found
        if spec.kind == "score":
            # auto's CCPO candidate trains no longer than the run's other policies
            steps = min(cache.base_config.steps, AUTO_RL_STEPS)
            return ScoreRow(name, settings={"auto_ccpo_steps": steps})
        return TrainedRow(name, spec.trainer, lam, spec.scoring, cache)
    p = Path(name)
    if p.is_dir():
        pol = load_policy(p)
        if pol.answer == "single":
            return SingleRow(p.name, pol.delta, pol)
        return ArtifactRow(p, cache)
    return make_baseline(name)


def resolve_policies(
    names: Sequence[str], ep: Episodes, cache: TrainingCache | None = None, trained: bool = False
) -> list[Policy]:
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
