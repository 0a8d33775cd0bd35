"""The whole comparison of one trace set at one α: every baseline, the CPO family, CCPO (λ = 0
and λ > 0) and the oracle, on the same training split and evaluation splits."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ccpo.evaluation.harness import ResultRow, evaluate_policies, load_splits
from ccpo.evaluation.rows import (
    SpecRow,
    TrainingCache,
    available_policies,
    resolve_policies,
    training_key,
)
from ccpo.learning.baselines import Row, Splits
from ccpo.learning.config import TrainConfig
from ccpo.policies.spec import variant_name
from ccpo.report.money import print_money
from ccpo.report.plots import training_curves
from ccpo.report.results import write_results
from ccpo.report.tables import print_results
from ccpo.traces.episodes import Episodes


@dataclass
class CompareOutput:
    rows: list[ResultRow]
    files: dict[str, Path]
    seconds: float


@dataclass(frozen=True)
class CompareRun:
    """What one comparison is run with (the keyword arguments of :func:`start_training` and
    :func:`run_compare`): α, evaluation splits, training steps, seed, the λ of the extra CCPO
    rows, ε, price files and other :class:`TrainConfig` fields."""

    alpha: float
    splits: int = 100
    steps: int = 2000
    seed: int = 0
    lams: Sequence[float] = (0.5,)
    eps: float = 0.05
    prices: Sequence[Path] = ()
    settings: Mapping[str, Any] | None = None

    def config(self) -> TrainConfig:
        """The training config every trained row starts from (method, λ, α are per row)."""
        return base_config(self.steps, self.seed, self.eps, self.settings)


def _plan(
    traces: Path, run: CompareRun
) -> tuple[Episodes, dict[str, dict[str, Any]], tuple[int, int, int], Splits, list[str]]:
    """What a comparison runs on: episodes, the prices of their models (for results.json),
    split sizes, the evaluation splits, row names."""
    ep, used, sizes, sp = load_splits(traces, run.alpha, run.splits, run.seed, run.prices)
    names = available_policies(ep, trained=True)
    names[-1:-1] = [f"ccpo-lam{lam:g}" for lam in run.lams if lam > 0]
    return ep, used, sizes, sp, names


def _trained_keys(policies: Sequence[Row]) -> list[tuple[str, float]]:
    return [
        training_key(p.spec)
        for p in policies
        if isinstance(p, SpecRow) and p.spec.trains and p.policy is None
    ]


def base_config(
    steps: int, seed: int, eps: float, settings: Mapping[str, Any] | None = None
) -> TrainConfig:
    """The training config every trained row starts from (method, λ, α are set per row)."""
    return TrainConfig(**{**(settings or {}), "steps": steps, "seed": seed, "eps": eps})


def start_training(traces: Path, pool: Executor, **run: Any) -> TrainingCache:
    """Submit to ``pool`` every policy that :func:`run_compare` with the same arguments trains,
    and return at once; pass the returned cache to ``run_compare(cache=...)``. This lets
    several comparisons (``ccpo reproduce``: every α) share one pool of processes. ``run``:
    the fields of :class:`CompareRun`."""
    plan = CompareRun(**run)
    ep, _, _, sp, names = _plan(traces, plan)
    cache = TrainingCache(plan.config())
    cache.submit(_trained_keys(resolve_policies(names, ep, cache)), ep, sp.train, plan.alpha, pool)
    return cache


def run_compare(
    traces: Path,
    out: Path,
    *,
    console: Console | None = None,
    title: str | None = None,
    workers: int | None = None,
    cache: TrainingCache | None = None,
    **run: Any,
) -> CompareOutput:
    """``workers``: processes that train the (method, λ) policies at once [CPU cores + 1: a
    run is single-threaded]; results do not depend on it (each run is seeded by its config).
    ``cache``: from :func:`start_training` with the same arguments (its runs are used as they
    finish; ``workers`` is then ignored). ``run``: the fields of :class:`CompareRun`."""
    console = console or Console()
    workers = (os.cpu_count() or 1) + 1 if workers is None else workers
    t0 = time.perf_counter()
    plan = CompareRun(**run)
    alpha, splits, steps, seed = plan.alpha, plan.splits, plan.steps, plan.seed
    ep, used, sizes, sp, names = _plan(traces, plan)
    config = plan.config()
    if cache is None:
        cache = TrainingCache(config)
    elif cache.base_config != config:
        raise ValueError(
            "cache was started with other steps, seed, eps or settings than this comparison"
        )
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, disable=not console.is_terminal,
    ) as prog:  # fmt: skip
        tasks: dict[str, int] = {}

        def on_step(label: str, step: int, entry: dict[str, float]) -> None:
            if label not in tasks:
                tasks[label] = prog.add_task(f"train {label}", total=steps)
            prog.update(tasks[label], completed=step)

        cache.progress = on_step
        policies = resolve_policies(names, ep, cache)
        keys = _trained_keys(policies)
        if cache.pending:
            console.print(f"training {len(cache.pending)} policies in a shared pool …")
        elif workers > 1 and len(set(keys)) > 1:
            console.print(f"training {len(set(keys))} policies in {workers} processes …")
        cache.prefetch(keys, ep, sp.train, alpha, workers)
        rows = evaluate_policies(ep, policies, sp, alpha, seed)
    title = title or traces.name
    files = write_results(
        out,
        rows,
        alpha,
        title=title,
        traces=str(traces),
        splits=splits,
        seed=seed,
        steps=steps,
        sizes=dict(zip(("train", "cal", "test"), sizes, strict=True)),
        against=ep.labels,
        prices=used,
        **({"simulated": ep.simulated} if ep.simulated else {}),
    )
    logs = {variant_name(m, lam): p.log for (m, lam), p in cache.trained.items()}
    if logs:
        files["curves"] = training_curves(logs, alpha, out / "training_curves.png")
    seconds = time.perf_counter() - t0
    print_results(console, rows, title, alpha, splits, sizes, ep.labels, ep.simulated)
    print_money(console, rows, sizes[2])
    console.print(f"compare took {seconds:.1f} s; wrote {out}/results.json and plots")
    return CompareOutput(rows, files, seconds)
