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
from ccpo.policies.base import Policy
from ccpo.policies.pipeline import train_policy
from ccpo.policies.registry import load_policy
from ccpo.policies.single import DELTA
from ccpo.policies.spec import PolicySpec, compare_rows, names_a_method, parse_spec, variant_name
from ccpo.policies.techniques.rl import AUTO_RL_STEPS
from ccpo.traces.episodes import Episodes, Metrics, conformal_rollout, step_mask

#: the single-answer rows of ``compare`` (:mod:`ccpo.policies.single`), beside the set rows
SINGLE_ROWS = ("cstop-single", "auto-single")
#: ``always-<model>``: call only the ladder's strongest model (the saving's yardstick)
ALWAYS = "always-"


@dataclass
class TrainingCache:
    """Trains each π (trainer, λ) once per harness run and hands it to every row that scores
    it: ``cpo``, ``cpo-batch`` and ``cpo-online`` are one CPO run scored three ways."""

    base_config: TrainConfig = field(default_factory=TrainConfig)
    progress: Callable[[str, int, dict[str, float]], None] | None = None
    trained: dict[tuple[str, float], Policy] = field(default_factory=dict)
    pending: dict[tuple[str, float], Future[Policy]] = field(default_factory=dict)

    def spec(self, key: tuple[str, float]) -> PolicySpec:
        """The spec training the π of ``key`` with this run's config."""
        return PolicySpec(key[0], lam=key[1], train_config=self.base_config)

    def submit(
        self,
        keys: Sequence[tuple[str, float]],
        ep: Episodes,
        train_idx: np.ndarray,
        alpha: float,
        pool: Executor,
    ) -> None:
        """Start training the missing (trainer, λ) policies in ``pool`` and return at once;
        :meth:`get` waits for each. Each run is seeded by its config, so the results equal
        :meth:`get`'s one by one; the progress callback sees each run once, at its last step."""
        for key in dict.fromkeys(keys):
            if key not in self.trained and key not in self.pending:
                self.pending[key] = pool.submit(
                    _train_one, self.spec(key), ep, train_idx, alpha, self.base_config.seed
                )

    def prefetch(
        self,
        keys: Sequence[tuple[str, float]],
        ep: Episodes,
        train_idx: np.ndarray,
        alpha: float,
        workers: int,
    ) -> None:
        """Train the missing (trainer, λ) policies in ``workers`` processes at once (a pool of
        its own: see :func:`training_pool`) and wait for all of them."""
        todo = [k for k in dict.fromkeys(keys) if k not in self.trained and k not in self.pending]
        if workers < 2 or len(todo) < 2:
            return
        with training_pool(min(workers, len(todo))) as pool:
            self.submit(todo, ep, train_idx, alpha, pool)
            keys_of = {fut: key for key, fut in self.pending.items()}
            for fut in as_completed(keys_of):
                self._finish(keys_of[fut])

    def _finish(self, key: tuple[str, float]) -> Policy:
        self.trained[key] = self.pending.pop(key).result()
        if self.progress is not None:
            last = self.trained[key].log[-1] if self.trained[key].log else {}
            self.progress(variant_name(*key), self.base_config.steps, last)
        return self.trained[key]

    def get(
        self, key: tuple[str, float], ep: Episodes, train_idx: np.ndarray, alpha: float
    ) -> Policy:
        if key in self.pending:
            return self._finish(key)
        if key not in self.trained:
            label = variant_name(*key)
            cb = (
                None
                if self.progress is None
                else (lambda step, entry: self.progress(label, step, entry))
            )  # type: ignore[misc]
            got = train_policy(self.spec(key), ep, train_idx, alpha, self.base_config.seed,
                               progress=cb)  # fmt: skip
            self.trained[key] = got.policy
        return self.trained[key]


def training_key(spec: PolicySpec) -> tuple[str, float]:
    """What an RL row's π is trained as: (trainer, λ), shared by the rows scoring it."""
    assert spec.technique.trainer is not None
    return spec.technique.trainer, spec.lam


def training_pool(workers: int) -> ProcessPoolExecutor:
    """Processes for training runs (spawned: no fork of a process holding BLAS threads)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _train_one(
    spec: PolicySpec, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int
) -> Policy:
    """One training run in a worker process (module level, so that it pickles)."""
    return train_policy(spec, ep, train_idx, alpha, seed).policy


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

    def auto_pick(self) -> dict[str, Any]:
        """``{"picked": name}`` when ``auto`` chose this row's technique, else ``{}``."""
        if self.policy is None or "auto" not in self.policy.info:
            return {}
        return {"picked": self.policy.info["auto"]["picked"]}


class SpecRow(PolicyRow):
    """A row fitted by :func:`~ccpo.policies.pipeline.train_policy` from its spec on the
    training split (an RL π through :class:`TrainingCache`, shared by the rows scoring it).
    A single-answer row's λ̂ is certified by Learn-then-Test on each calibration split; where
    a split certifies none, the most conservative rule is scored and the split counted as
    refused (``refused_share``)."""

    def __init__(self, spec: PolicySpec, cache: TrainingCache | None = None) -> None:
        self.spec, self.cache, self.name = spec, cache or TrainingCache(), spec.name
        self.kind = "single" if spec.single else "point" if spec.greedy else "conformal"

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        if self.spec.trains:
            trained = self.cache.get(training_key(self.spec), ep, train_idx, alpha)
            self.policy = replace(trained, variant=self.name)  # type: ignore[type-var]
        else:
            spec = replace(self.spec, calibration_size=self.calibration_size)
            self.policy = train_policy(spec, ep, train_idx, alpha, seed).policy

    def result_extra(self) -> dict[str, Any]:
        return policy_extra(self, self.spec.single, self.spec.delta)


class FolderRow(PolicyRow):
    """A policy folder from ``ccpo train``; a calibrated one is re-calibrated on each split."""

    def __init__(self, folder: Path, policy: Policy) -> None:
        self.name, self.policy = folder.name, policy
        self.kind = "single" if policy.single else "point" if policy.greedy else "conformal"

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        assert self.policy is not None
        if abs(self.policy.alpha - alpha) > 1e-12 and not self.policy.calibrates:
            how = "point" if self.policy.greedy else "online"
            raise CCPOError(
                f"{self.name} was trained for α = {self.policy.alpha:g}; its "
                f"{how} scoring cannot be re-targeted to α = {alpha:g}"
            )

    def result_extra(self) -> dict[str, Any]:
        assert self.policy is not None
        return policy_extra(self, self.policy.single, self.policy.delta or DELTA)


def policy_extra(row: PolicyRow, single: bool, delta: float) -> dict[str, Any]:
    """results.json's fields of a policy row beyond its metrics: auto's pick, the mean
    threshold, and for one answer δ and the share of refused splits."""
    out: dict[str, Any] = {"answer": "single", "delta": delta} if single else {}
    marginal = single and row.policy is not None and getattr(row.policy, "marginal", False)
    if marginal:
        out["guarantee"] = "marginal"
    out.update(row.auto_pick())
    if row._thresholds is None:
        return out
    mean = float(last_threshold(row._thresholds).mean())
    if not single:
        return {**out, "kappa_mean": mean}
    assert row._refused is not None
    return {**out, "refused_share": float(row._refused.mean()), "threshold_mean": mean}


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
        alone = ep.strongest_step
        step = None if alone is None else step_mask(alone, test.shape, ep.horizon)
        return Metrics(
            cost=ep.strongest_cost[test],
            covered=ep.strongest_correct[test] | ~ep.solvable[test],
            length=ones,
            set_size=ones,
            latency=None if ep.strongest_latency is None else ep.strongest_latency[test],
            called=step,
            returned=step,
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


def make_policy(name: str, cache: TrainingCache | None) -> Row:
    """A row: a method of :mod:`ccpo.policies.spec`'s grammar, a policy folder, or a
    baseline."""
    if name.startswith(ALWAYS):
        return AlwaysRow(name)
    if name == PROMPT_ROUTER:
        return PromptRouterRow()
    spec = _spec_of(name, cache or TrainingCache())
    if spec is not None:
        return SpecRow(spec, cache)
    p = Path(name)
    if p.is_dir() and (p / "policy.json").is_file():
        return FolderRow(p, load_policy(p))
    try:
        # a baseline's name wins over a folder of that name that holds no policy
        return make_baseline(name)
    except CCPOError:
        if p.is_dir():
            load_policy(p)  # raises: says the folder is not a trained policy
        raise


def _spec_of(name: str, cache: TrainingCache) -> PolicySpec | None:
    """The spec of a method row (``None``: not a method's name); auto's CCPO candidate trains
    no longer than the run's other policies."""
    if not names_a_method(name):
        return None
    steps = min(cache.base_config.steps, AUTO_RL_STEPS)
    return parse_spec(name, settings={"auto_ccpo_steps": steps}, train_config=cache.base_config)


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
